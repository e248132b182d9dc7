"""A plugin module's own process: it imports the module, hands the run each backend's declaration as data, and
answers the questions about a case that need the plugin's code; the run's process holds a stand-in per backend."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import torch

from harness.backends import registry
from harness.backends.base import Backend, DescriptionHooks, ProbeHooks
# a declaration's data may hold serving knobs (a plugin subclassing a built-in inherits its `serving`): the run's
# unpickler takes only classes of modules imported here, and `harness.load_backend_module` may be the first call
from harness.backends.serving import ServingKnob  # noqa: F401
from harness.isolation.child import REFUSED, START_TIMEOUT_S, TIMED_OUT, Child, Gone, child_channel, serve
from harness.store.kernels import source_version

#: seconds one question (e.g. not_supported_reasons(case)) may take in the module's process
ASK_TIMEOUT_S = 120.0
#: the class data a backend declares (Backend's non-callable class attributes): copied to the run's process as is
DATA = tuple(sorted({name for cls in (Backend, ProbeHooks, DescriptionHooks) for name, value in vars(cls).items()
                     if not name.startswith("_") and not callable(value)
                     and not isinstance(value, (classmethod, staticmethod, property))}))
#: Backend's methods whose answer a plugin may compute with its own code: asked of the module's process per call
#: where the plugin overrides them, else Backend's own code answers here from the data
ASKED = ("unavailable_reason", "not_supported_reasons", "modifier_reasons", "backward_reasons", "can_run", "supports",
         "modifier_path", "mask_form")
#: Backend's methods without arguments about the case: answered once, when the module loads
ONCE = ("version", "installed_version", "kernels")

_HOSTS: dict[str, "PluginHost"] = {}


def declaration(backend: Backend, replace: bool, spec: str | None = None) -> dict:
    """What the run's process learns of a registered backend: its data, its once-answers, which methods it asks, and
    whether it was registered with replace=True. A backend with no package of its own is versioned by its module's
    source (store.kernels.source_version: its rows' backend_version, so history tells two versions apart)."""
    cls = type(backend)
    once = {name: _text(getattr(backend, name)()) for name in ONCE} | {"version_key": _text(cls.version_key())}
    if cls.package is None and spec is not None and cls.version is Backend.version:
        once["version"] = source_version(spec) or once["version"]
    return {"module": cls.__module__, "qualname": cls.__qualname__, "replace": replace,
            "data": {name: getattr(cls, name) for name in DATA}, "once": once,
            "asked": [name for name in ASKED if getattr(cls, name) is not getattr(Backend, name)]}


def _text(value: Any) -> str | None:
    """A string as plain str (torch's version is a str subclass the run's process does not unpickle), None kept."""
    return None if value is None else str(value)


def host_main(conn, spec: str) -> None:
    """The module's process: import `spec`, send its backends' declarations, then answer questions until stopped."""
    channel = child_channel(conn)
    try:
        registry.all_backends()  # the built-ins first, so a name taken by one is refused here as it would be there
        registry.import_backend_module(spec)
        backends = {name: b for name, b in registry.all_backends().items() if registry.modules_for(name) == (spec,)}
        channel.send(("ready", [declaration(b, registry.replaces(name), spec) for name, b in backends.items()]))
    except BaseException as exc:  # noqa: B036 - a ValueError names the module and the problem in one line
        channel.send(("failed", str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"))
        return

    def answer(kind: str, payload) -> tuple[str, Any]:
        name, method, args, kwargs = payload
        try:
            return "ok", getattr(backends[name], method)(*args, **kwargs)
        except Exception as exc:
            return "failed", f"{type(exc).__name__}: {exc}"

    serve(channel, answer)


class PluginHost:
    """The process that imported plugin module `spec` (an absolute path or a dotted name) and its declarations."""

    def __init__(self, spec: str):
        self.spec = spec
        self._lock = threading.Lock()  # the prefetcher's thread may ask beside the run
        self._child = Child(host_main, (spec,), "harness-plugin-host")
        status, answer = self._receive(START_TIMEOUT_S, "importing it")
        if status != "ready":
            self.close()
            raise ValueError(answer)
        self.declarations: list[dict] = answer
        #: the run's stand-in of each declared backend (declare_module)
        self.stand_ins: list[Backend] = []

    def _receive(self, timeout: float, doing: str) -> tuple[str, Any]:
        try:
            return self._child.receive(timeout)
        except Gone as gone:
            if gone.why == REFUSED:
                return "failed", f"--backend-module {self.spec!r}: {gone.text}"
            self._child.kill()
            what = f"took over {timeout:g} s" if gone.why == TIMED_OUT else f"ended (exit status {gone.exitcode})"
            return "failed", f"--backend-module {self.spec!r}: its process {what} while {doing}"

    def ask(self, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """backend `name`'s method(*args, **kwargs), computed by the plugin's code in its process."""
        with self._lock:
            if self.pid is None:
                raise RuntimeError(f"--backend-module {self.spec!r}: its process has ended; {name}.{method} cannot "
                                   "be answered")
            self._child.send(("ask", (name, method, args, kwargs)))
            status, answer = self._receive(ASK_TIMEOUT_S, f"answering {name}.{method}")
        if status != "ok":
            raise RuntimeError(f"{name}.{method} failed in its module's process: {answer}")
        return answer

    @property
    def pid(self) -> int | None:
        return self._child.pid

    def close(self) -> None:
        self._child.stop()


class Declared(Backend):
    """A plugin backend in the run's process: its declared data, Backend's own code, and the plugin's answers from
    its module's process; its `prepare` and `forward` run only in its workers."""

    host: ClassVar[PluginHost]

    def prepare(self, case, device, **kwargs):
        raise RuntimeError(f"{self.name}'s code runs only in its worker: its module is not imported in this process")

    def forward(self, q, k, v, *, mask, scale, **kwargs):
        return self.prepare(None, q.device)


def _asked(method: str):
    def ask(self, *args, **kwargs):
        return self.host.ask(self.name, method, *args, **kwargs)
    ask.__name__ = method
    return ask


def _answered(value: Any):
    return lambda self: value


def stand_in(declared: dict, host: PluginHost) -> Backend:
    """The run process's backend for one declaration: its class carries the data and answers as the plugin would."""
    once = declared["once"]
    attrs = {**declared["data"], **{name: _answered(once[name]) for name in ONCE},
             **{name: _asked(name) for name in declared["asked"]},
             "version_key": classmethod(lambda cls: once["version_key"]),
             "__module__": declared["module"], "__qualname__": declared["qualname"], "host": host}
    return type(declared["qualname"].rsplit(".", 1)[-1], (Declared,), attrs)()


def declare_module(spec: str) -> PluginHost:
    """Start the process of plugin module `spec` (once per module) and register a stand-in for each backend it
    registers; a module that fails to import, or a bad declaration, is a ValueError in one line, as when imported."""
    from harness.backends.registry import add, all_backends, module_spec

    spec = module_spec(spec)
    if spec in _HOSTS:  # loaded already, as an import is once: its stand-ins put back where they were dropped
        host = _HOSTS[spec]
        for backend in host.stand_ins:
            if backend.name not in all_backends():
                add(backend, origin=spec)
        return host
    host = PluginHost(spec)
    try:
        host.stand_ins = [stand_in(declared, host) for declared in host.declarations]
        for backend, declared in zip(host.stand_ins, host.declarations):
            add(backend, origin=spec, replace=declared["replace"])
    except ValueError:
        host.close()
        raise
    _HOSTS[spec] = host
    return host


def host_pids() -> list[int]:
    """The live plugin modules' processes (the plugin's code runs there too: stopped while a backend is timed)."""
    return [host.pid for host in _HOSTS.values() if host.pid is not None]




def load_backend_module(spec: str, *, here: bool = False) -> Any:
    """Load a user module (a dotted name or a .py path) of backends: by default in a process of its own, which hands
    this one each backend's declaration as data (no plugin code ever runs here); `here=True` imports it in this
    process (--no-isolate, in-process and unguarded). Returns the module (here) or its host process."""
    if here:
        return registry.import_backend_module(spec)
    host = declare_module(spec)
    registry.note_loaded(host.spec)
    return host
