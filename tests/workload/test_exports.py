import podsnap.workload


def test_public_names_are_exactly_the_documented_surface() -> None:
    exported = set(podsnap.workload.__all__)
    public = {n for n in dir(podsnap.workload) if not n.startswith("_")}
    # submodules show up as attributes once imported; they are not part of the re-exported surface
    public -= {"run", "engines"}
    assert exported == public
    for name in exported - {"QuiesceHook", "ResumeHook"}:  # those two are type aliases
        assert getattr(podsnap.workload, name).__module__.startswith("podsnap.workload._")
    assert {"SnapshotControl", "ResumeInfo", "SnapshotError", "RestoreTimeout"} <= exported
