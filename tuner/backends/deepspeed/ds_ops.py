#!/usr/bin/env python3
"""DeepSpeed's C++ ops that the deepspeed backend's trials load: which ones, where torch builds them
(its extensions directory), and a build lock left behind by a build that was killed.

DeepSpeed compiles these ops on first use (torch.utils.cpp_extension.load: a build directory per op
under the extensions directory, guarded by a lock file that every later load waits on). A sweep runs
`ds_ops.py prepare` once before its first trial, with no timeout, so that no trial compiles them
inside its own timeout; ds_trial.py then loads them through load_trial_ops.

  ds_ops.py prepare --device cpu|cuda --result RESULT.json --log BUILD.log

prints one progress line on stdout ("deepspeed backend: building DeepSpeed's CPU ops (a, b) once,
into DIR ... done in N s"), sends everything else (DeepSpeed's logs, the compiler's output) to
BUILD.log, and writes RESULT.json: {"status": "ok", "extensions_dir": DIR, "ops": [...],
"seconds": N}, or {"status": "stale_lock" | "failed", "message": ONE LINE}. Exit status 0 ok,
2 a stale lock, 1 a failed build, 130 interrupted (SIGINT or SIGTERM: the build stops and torch's
lock is released).
"""
import argparse
import contextlib
import json
import os
import signal
import sys
import time

# The builders of the ops a trial loads (DeepSpeed 0.19): the shared-memory collectives op, built
# by every deepspeed.init_distributed (deepspeed.comm.torch.build_shm_op) whatever the backend
# then uses; FusedAdam, the optimizer of the exported `"type": "AdamW"` config; CPUAdam instead
# when zero_optimization.offload_optimizer is set (ZeRO 1-3).
COMM_BUILDER = "ShareMemCommBuilder"
FUSED_ADAM_BUILDER = "FusedAdamBuilder"
CPU_ADAM_BUILDER = "CPUAdamBuilder"
ALL_BUILDERS = (COMM_BUILDER, FUSED_ADAM_BUILDER, CPU_ADAM_BUILDER)

# A lock without an owner is checked again after this long before it is called stale: the file
# exists a moment before its creator's descriptor shows in /proc.
RECHECK_S = 0.5


def set_accelerator(device):
    """Before deepspeed is imported: its CPU accelerator for device cpu (as ds_trial.py does)."""
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def extensions_dir():
    """The directory torch builds JIT extensions in: TORCH_EXTENSIONS_DIR, else torch's default
    (the user's cache dir /torch_extensions/py<ver>_<cpu|cuXY|rocmXY>), as
    torch.utils.cpp_extension._get_build_directory resolves it. Each op builds in DIR/<op name>."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return os.path.abspath(root)
    import torch
    from torch.utils.cpp_extension import get_default_build_root
    if torch.version.hip is not None:
        accelerator = "rocm" + torch.version.hip.replace(".", "")
    elif torch.version.cuda is not None:
        accelerator = "cu" + torch.version.cuda.replace(".", "")
    else:
        accelerator = "cpu"
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return os.path.join(get_default_build_root(), f"{python}_{accelerator}")


def jit_builders(names):
    """The builders among `names` (ALL_BUILDERS entries) that DeepSpeed JIT-loads on this
    accelerator: those it has, that are compatible, and that were not installed prebuilt
    (DS_BUILD_OPS=1), as OpBuilder.load decides. REQUIRES: deepspeed importable."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import accelerator_name, installed_ops
    accelerator = get_accelerator()
    builders = []
    for name in names:
        builder = accelerator.create_op_builder(name)
        if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            continue
        if installed_ops.get(builder.NAME, False) and accelerator_name == accelerator._name:
            continue  # imported from the installation, never built
        builders.append(builder)
    return builders


def trial_builders(ds_config):
    """The builders a trial of `ds_config` (its ds_config.json) JIT-loads."""
    offload = "offload_optimizer" in (ds_config.get("zero_optimization") or {})
    return jit_builders([COMM_BUILDER, CPU_ADAM_BUILDER if offload else FUSED_ADAM_BUILDER])


def _lock_is_open(lock):
    """Whether a live process on this machine has `lock` open (torch's FileBaton holds the
    descriptor of the lock it created until it releases it), or None when a process of the lock's
    owner cannot be inspected (another user's, without the rights)."""
    try:
        target = os.stat(lock)
    except FileNotFoundError:
        return True  # released meanwhile: not stale
    unknown = False
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != target.st_uid:
                continue  # only its owner's processes can hold a lock they created
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue  # ended meanwhile
        except PermissionError:
            unknown = True
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if st.st_ino == target.st_ino and st.st_dev == target.st_dev:
                return True
    return None if unknown else False


def stale_lock(names, root=None):
    """The first DIR/<name>/lock that no live process on this machine holds (left by a build that
    was killed: every later load of that op would wait on it forever), or None. A lock held by a
    live process (a build under way), or whose owner's processes cannot be inspected, is not
    stale. Deletes nothing. `root`: extensions_dir() when None."""
    root = root or extensions_dir()
    for name in names:
        lock = os.path.join(root, name, "lock")
        if not os.path.exists(lock) or _lock_is_open(lock) is not False:
            continue
        time.sleep(RECHECK_S)
        if os.path.exists(lock) and _lock_is_open(lock) is False:
            return lock
    return None


def stale_lock_message(lock):
    return (f"deepspeed backend: {lock} is left from a build of DeepSpeed's ops that was killed "
            f"(no process on this machine holds it, and every load of the op would wait on it); "
            f"remove it and run again")


class Stopped(BaseException):
    """SIGTERM while loading ops: raised so that torch's `finally` releases its build lock."""


@contextlib.contextmanager
def released_on_sigterm():
    """SIGTERM inside the block unwinds it (torch releases the lock of a build or load under way)
    and then ends the process by SIGTERM as before; SIGINT unwinds it as KeyboardInterrupt, also
    when the process started with SIGINT ignored (as a background job does). Outside the block
    both act as they did."""
    def stop(signum, frame):
        raise Stopped()
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except Stopped:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGTERM)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


# Set by the sweep to the extensions directory its prepare step built (or loaded) every op in,
# for this run of the sweep: its trials import them from there as they are.
PREPARED_ENV = "ULYSSES_DEEPSPEED_OPS_DIR"


def load_trial_ops(ds_config):
    """In a trial, before deepspeed.init_distributed: loads the trial's ops and returns None
    (DeepSpeed keeps them for init_distributed and initialize). Ops the sweep's prepare step built
    are imported from their build directory as they are: no compiler, ninja or lock. Others go
    through DeepSpeed's loader (torch's JIT load, which may build them): when one of their build
    directories holds a stale lock (stale_lock), nothing is loaded and its path is returned
    instead. A SIGTERM while they load leaves no lock behind."""
    from deepspeed.ops.op_builder.builder import OpBuilder
    from torch.utils.cpp_extension import _import_module_from_library
    root = extensions_dir()
    prepared = os.environ.get(PREPARED_ENV) == root
    loader = []
    for builder in trial_builders(ds_config):
        build_dir = os.path.join(root, builder.NAME)
        if prepared and is_built(root, builder.NAME):
            OpBuilder._loaded_ops[builder.NAME] = _import_module_from_library(
                builder.NAME, build_dir, True)
        else:
            loader.append(builder)
    lock = stale_lock([b.NAME for b in loader], root)
    if lock:
        return lock
    with released_on_sigterm():
        for builder in loader:
            builder.load(verbose=False)
    return None


def is_built(root, name):
    """Whether DIR/<name> holds a built module (torch writes <name>.so there)."""
    return os.path.exists(os.path.join(root, name, name + ".so"))


def prepare(args):
    # Progress lines go to the caller's stdout; everything else, from here on, to the log.
    progress = os.fdopen(os.dup(1), "w")
    with open(args.log, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)

    def result(status, code, **fields):
        with open(args.result + ".tmp", "w") as f:
            json.dump(dict(status=status, **fields), f)
        os.replace(args.result + ".tmp", args.result)
        progress.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    set_accelerator(args.device)
    root = extensions_dir()
    os.environ["TORCH_EXTENSIONS_DIR"] = root  # exactly the directory the trials get
    try:
        builders = jit_builders(ALL_BUILDERS)
    except Exception as e:  # noqa: BLE001 -- one line for the sweep
        first = (str(e).strip().splitlines() or [""])[0]
        result("failed", 1, message=f"{type(e).__name__}: {first}".rstrip(": "))
    names = [b.NAME for b in builders]
    lock = stale_lock(names, root)
    if lock:
        result("stale_lock", 2, message=stale_lock_message(lock), extensions_dir=root, ops=names)
    if not builders:
        result("ok", 0, extensions_dir=root, ops=[], seconds=0.0)
    building = [n for n in names if not is_built(root, n)]
    kind = args.device.upper()
    if building:
        progress.write(f"deepspeed backend: building DeepSpeed's {kind} ops ({', '.join(building)})"
                       f" once, into {root} (this can take minutes) ...")
    else:
        progress.write(f"deepspeed backend: loading DeepSpeed's {kind} ops ({', '.join(names)}) "
                       f"from {root} ...")
    progress.flush()
    start = time.monotonic()
    try:
        with released_on_sigterm():
            for builder in builders:
                builder.load(verbose=True)  # the build's output goes to the log
    except KeyboardInterrupt:
        progress.write(" interrupted\n")
        progress.flush()
        os._exit(130)
    except Exception as e:  # noqa: BLE001 -- one line for the sweep, the rest in the log
        import traceback
        traceback.print_exc()
        lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
        progress.write(" failed\n")
        result("failed", 1, extensions_dir=root, ops=names,
               message=f"{type(e).__name__}: {lines[-1] if lines else ''}".rstrip(": "))
    seconds = time.monotonic() - start
    progress.write(f" done in {seconds:.0f} s\n")
    result("ok", 0, extensions_dir=root, ops=names, seconds=seconds)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    q = sub.add_parser("prepare", help="build (or load) every op a trial may load, once")
    q.add_argument("--device", choices=["cpu", "cuda"], required=True)
    q.add_argument("--result", required=True, help="JSON file written with the outcome")
    q.add_argument("--log", required=True, help="file for the build's output")
    args = p.parse_args()
    try:
        prepare(args)
    except KeyboardInterrupt:
        os._exit(130)


if __name__ == "__main__":
    main()
