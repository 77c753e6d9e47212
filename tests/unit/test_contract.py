import json

import pytest

from podsnap import contract


def test_restore_context_round_trips_and_ignores_unknown_keys() -> None:
    ctx = contract.RestoreContext(env={"POD_NAME": "w-1", "POD_IP": "10.0.0.7"})
    data = json.loads(ctx.to_json())
    assert data == {"version": 1, "env": {"POD_IP": "10.0.0.7", "POD_NAME": "w-1"}}
    data["future"] = {"x": 1}
    assert contract.RestoreContext.from_json(json.dumps(data)) == ctx


@pytest.mark.parametrize(
    ("text", "message"),
    [("[]", "JSON object"), ('{"version": 0}', "'version'"), ('{"env": {"A": 1}}', "'env'")],
)
def test_restore_context_rejects_bad_input_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        contract.RestoreContext.from_json(text)


def test_content_name_is_derived_from_the_snapshot_uid() -> None:
    assert contract.content_name("abc") == "podsnapshotcontent-abc"


def test_every_crd_kind_has_a_distinct_plural_and_short_name() -> None:
    plurals = [v[0] for v in contract.CRDS.values()]
    shorts = [s for v in contract.CRDS.values() for s in v[2]]
    assert len(set(plurals)) == len(plurals) == 4
    assert len(set(shorts)) == len(shorts)
    assert contract.CRDS[contract.KIND_POD_SNAPSHOT_CONTENT][3] is False


@pytest.mark.parametrize(
    ("value", "expected"), [("true", True), ("TRUE", True), ("1", True), ("no", False), (None, False)]
)
def test_truthy_flags(value: str | None, expected: bool) -> None:
    assert contract.is_truthy(value) is expected
