"""An engine's API surface read from its source with `ast`: nothing of the engine is imported.

`SourceTree(root)` answers: the methods of a class (with the signature of each, bases followed
through the package's own imports), the routes of a FastAPI module (decorators and
`add_api_route` calls), the members of a `Literal[...]` alias and the fields of a request class.
`Recorder(surface)` is an object that has exactly a class's methods: calling one checks the
arguments against the source signature and records the call, so an adapter run against it proves
every call it makes exists as made.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Method:
    name: str
    signature: inspect.Signature
    is_async: bool
    where: str


@dataclass
class ClassSurface:
    name: str
    where: str
    methods: dict[str, Method] = field(default_factory=dict)
    #: names assigned as `self.NAME = ...` anywhere in the class
    attributes: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    function: ast.FunctionDef | ast.AsyncFunctionDef
    where: str

    @property
    def params(self) -> set[str]:
        a = self.function.args
        return {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> inspect.Signature:
    a = fn.args
    params: list[inspect.Parameter] = []
    positional = [*a.posonlyargs, *a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        kind = inspect.Parameter.POSITIONAL_ONLY if i < len(a.posonlyargs) else inspect.Parameter.POSITIONAL_OR_KEYWORD
        params.append(inspect.Parameter(arg.arg, kind, default=inspect.Parameter.empty if default is None else ...))
    if a.vararg:
        params.append(inspect.Parameter(a.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
    for arg, kw_default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        default = inspect.Parameter.empty if kw_default is None else ...
        params.append(inspect.Parameter(arg.arg, inspect.Parameter.KEYWORD_ONLY, default=default))
    if a.kwarg:
        params.append(inspect.Parameter(a.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


class SourceTree:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._parsed: dict[Path, ast.Module] = {}

    def module(self, dotted_or_path: str) -> tuple[Path, ast.Module]:
        path = self.root / dotted_or_path if dotted_or_path.endswith(".py") else self._module_path(dotted_or_path)
        if path not in self._parsed:
            self._parsed[path] = ast.parse(path.read_text(), filename=str(path))
        return path, self._parsed[path]

    def _module_path(self, dotted: str) -> Path:
        base = self.root.joinpath(*dotted.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.exists():
                return candidate
        raise FileNotFoundError(f"module {dotted} not in {self.root}")

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def cls(self, module: str, name: str) -> ClassSurface:
        """The class `name` of `module`, with the methods of its bases that this tree defines."""
        path, tree = self.module(module)
        node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
        if node is None:
            raise LookupError(f"class {name} not in {self._rel(path)}")
        surface = ClassSurface(name, self._rel(path))
        # bases first, so the class's own definitions override theirs
        for base in node.bases:
            base_name = (
                base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
            )
            origin = self._import_origin(tree, base_name) if base_name else None
            if origin is not None:
                try:
                    inherited = self.cls(origin, base_name or "")
                except (LookupError, FileNotFoundError):
                    continue
                surface.methods.update(inherited.methods)
                surface.attributes |= inherited.attributes
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                surface.methods[item.name] = Method(
                    item.name,
                    _signature(item),
                    isinstance(item, ast.AsyncFunctionDef),
                    f"{self._rel(path)}:{item.lineno}",
                )
        for sub in ast.walk(node):
            for target in getattr(sub, "targets", None) or ([sub.target] if isinstance(sub, ast.AnnAssign) else []):
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    surface.attributes.add(target.attr)
        return surface

    def _import_origin(self, tree: ast.Module, name: str) -> str | None:
        for node in tree.body:
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and any((a.asname or a.name) == name for a in node.names)
            ):
                return node.module
        return None

    def routes(self, module: str) -> Iterator[Route]:
        """(HTTP method, path, handler) of every route the module declares."""
        path, tree = self.module(module)
        functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        for fn in functions.values():
            for deco in fn.decorator_list:
                if not (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute) and deco.args):
                    continue
                first = deco.args[0]
                if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                    continue
                verb = deco.func.attr
                if verb in ("get", "post", "put", "delete"):
                    yield Route(verb.upper(), first.value, fn, self._rel(path))
                elif verb == "api_route":
                    for m in _keyword_strings(deco, "methods") or ["GET"]:
                        yield Route(m.upper(), first.value, fn, self._rel(path))
        for call in ast.walk(tree):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "add_api_route"
            ) and (
                len(call.args) >= 2
                and isinstance(call.args[0], ast.Constant)
                and isinstance(call.args[1], ast.Attribute)
            ):
                handler = functions.get(call.args[1].attr)
                if handler is not None:
                    for m in _keyword_strings(call, "methods") or ["GET"]:
                        yield Route(m.upper(), str(call.args[0].value), handler, self._rel(path))

    def literal(self, module: str, alias: str) -> set[str]:
        """The members of `ALIAS = Literal["a", "b"]` in `module`."""
        _, tree = self.module(module)
        for node in tree.body:
            target = (
                node.targets[0]
                if isinstance(node, ast.Assign)
                else node.target
                if isinstance(node, ast.AnnAssign)
                else None
            )
            if isinstance(target, ast.Name) and target.id == alias and node.value is not None:
                return {
                    c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
        raise LookupError(f"{alias} not in {module}")

    def fields(self, module: str, cls: str) -> dict[str, ast.expr]:
        """Annotated class-level fields (`name: type = default`) of a request dataclass -> annotation."""
        _, tree = self.module(module)
        node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if node is None:
            raise LookupError(f"class {cls} not in {module}")
        return {
            item.target.id: item.annotation
            for item in node.body
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
        }

    def constants(self, module: str) -> dict[str, Any]:
        """Module-level `NAME = <literal>` assignments."""
        _, tree = self.module(module)
        out: dict[str, Any] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    out[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    continue
        return out


def _keyword_strings(call: ast.Call, name: str) -> list[str]:
    for kw in call.keywords:
        if kw.arg == name and isinstance(kw.value, ast.List | ast.Tuple):
            return [e.value for e in kw.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


class Recorder:
    """An object with exactly `surface`'s methods (plus named attributes); calls are checked and recorded."""

    def __init__(
        self, surface: ClassSurface, calls: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]], **attrs: object
    ) -> None:
        self._surface = surface
        self._calls = calls
        self._attrs = attrs

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._attrs:
            return self._attrs[name]
        method = self._surface.methods.get(name)
        if method is None:
            raise AttributeError(f"{self._surface.name} ({self._surface.where}) has no method {name}")

        def call(*args: Any, **kwargs: Any) -> object:
            try:
                method.signature.bind(None, *args, **kwargs)  # None stands for self
            except TypeError as e:
                raise TypeError(f"{self._surface.name}.{name} at {method.where}: {e}") from None
            self._calls.append((self._surface.name, name, args, kwargs))
            if method.is_async:

                async def done() -> None:
                    return None

                return done()
            return None

        return call
