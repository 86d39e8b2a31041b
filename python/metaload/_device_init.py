"""No CUDA initialisation inside metaload.meta() and metaload.fake(), without a Python mode on
every torch call.

torch's Python bindings initialise an accelerator before dispatching any call that names it
(`device="cuda"`, `.cuda()`, `.to("cuda")`, a cuda default device): they call
`torch.cuda._lazy_init()` unless libtorch_python's flag says it is done. Without a GPU that is an
error, with one it costs a CUDA context -- for tensors that MetaMode then puts on meta anyway
(FakeMode makes them fake). So while the innermost metaload scope of this thread is meta() or
fake(), the hook installed here answers the bindings' call without initialising; the binding
then marks the device done and dispatches, MetaMode's fallback (FakeMode's) redirects the call
onto meta and clears the flag again at once (require_device_init_again, base/torch_compat.h), so
a thread doing real work still gets torch's full initialisation on its first use. Calls from torch.cuda's own functions
(torch.cuda.current_device(), ...) are real requests and initialise as ever.

torch.tensor(data, device="cuda") moves its data to the device inside the binding with every mode
switched off; torch 2.x's flag `only_lift_cpu_tensors` (set by its own FakeTensorMode for the same
reason) makes it hand over the CPU tensor first and move it with a dispatched .to(), which MetaMode
sees. metaload sets it while any meta() scope is open in the process.
"""
import sys
import threading

import torch

from . import _thread_scope, _wrapped

_install_lock = threading.Lock()
_scopes_lock = threading.Lock()
_open_scopes = 0
_lift_flag_before = None
_HAS_LIFT_FLAG = hasattr(torch._C, "_set_only_lift_cpu_tensors")


def scope_opened():
    """A meta() scope opened somewhere in the process."""
    global _open_scopes, _lift_flag_before
    with _scopes_lock:
        if _open_scopes == 0:
            if _HAS_LIFT_FLAG:
                _lift_flag_before = torch._C._only_lift_cpu_tensors()
                torch._C._set_only_lift_cpu_tensors(True)
            _wrapped.wrap()
        _open_scopes += 1


def scope_closed():
    global _open_scopes
    with _scopes_lock:
        _open_scopes -= 1
        if _open_scopes == 0:
            if _HAS_LIFT_FLAG:
                torch._C._set_only_lift_cpu_tensors(bool(_lift_flag_before))
            _wrapped.unwrap()


def _hook(module, original):
    def _lazy_init():
        # From torch's own Python (torch.cuda.current_device() ...): a real request.
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if getattr(module, "_initialized", False) or caller.startswith(module.__name__) or \
                not _thread_scope.tensors_not_real():
            return original()
        return None

    _lazy_init.__metaload_original__ = original
    _lazy_init.__doc__ = original.__doc__
    return _lazy_init


def install():
    """Installs the hook on torch.cuda (and torch.xpu where it exists), once per process."""
    for name in ("cuda", "xpu"):
        module = getattr(torch, name, None)
        current = getattr(module, "_lazy_init", None)
        if current is None or hasattr(current, "__metaload_original__"):
            continue
        with _install_lock:
            current = module._lazy_init
            if not hasattr(current, "__metaload_original__"):
                module._lazy_init = _hook(module, current)
