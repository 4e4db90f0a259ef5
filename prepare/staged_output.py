"""The output directory of prepare_data.py: everything is written into a temporary directory beside
OUT and renamed into place at the end. An OUT that holds anything but a previous output of this
tool is refused and left as it is; a previous output is replaced only with --force."""
import json
import os
import tempfile

TOOL = "ulysses prepare_data"
OUTPUT_NAMES = frozenset(
    ["manifest.json"] + [f"{split}{part}{suffix}" for split in ("train", "eval")
                         for part in ("", "_loss_mask") for suffix in (".bin", ".idx")])


class OutputError(Exception):
    """OUT cannot be used: one line naming it."""


def is_previous_output(path):
    """True when `path` holds only files this tool writes, with its manifest."""
    try:
        names = set(os.listdir(path))
        with open(os.path.join(path, "manifest.json"), encoding="utf-8") as manifest_file:
            manifest = json.load(manifest_file)
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("tool") == TOOL and names <= OUTPUT_NAMES


def _check_target(out, force):
    if not os.path.exists(out):
        return
    if not os.path.isdir(out):
        raise OutputError(f"{out}: exists and is not a directory")
    if not os.listdir(out):
        return
    if not is_previous_output(out):
        raise OutputError(f"{out}: exists and holds files that are not a previous output of this "
                          "command; choose another directory")
    if not force:
        raise OutputError(f"{out}: holds a previous output; pass --force to replace it")


class StagedOutput:
    def __init__(self, out, force):
        self.out = os.path.abspath(out)
        self.force = force
        _check_target(self.out, force)
        parent = os.path.dirname(self.out)
        self.created_parents = []
        missing = parent
        while not os.path.exists(missing):
            self.created_parents.append(missing)
            missing = os.path.dirname(missing)
        for directory in reversed(self.created_parents):
            os.mkdir(directory)
        self.staging = tempfile.mkdtemp(prefix=f".{os.path.basename(self.out)}.tmp-", dir=parent)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.staging, 0o777 & ~umask)  # mkdtemp makes it private; OUT is an ordinary dir

    def path(self, name):
        return os.path.join(self.staging, name)

    def commit(self):
        """Renames the staging directory to OUT (replacing a previous output, file by file)."""
        _check_target(self.out, self.force)
        if os.path.isdir(self.out) and os.listdir(self.out):
            for name in os.listdir(self.out):
                os.remove(os.path.join(self.out, name))
        if os.path.isdir(self.out):
            os.rmdir(self.out)
        os.rename(self.staging, self.out)
        self.staging = None

    def discard(self):
        """Removes the staging directory (only the files this tool wrote) and any parent
        directory made for OUT."""
        if self.staging is None:
            return
        for name in os.listdir(self.staging):
            os.remove(os.path.join(self.staging, name))
        os.rmdir(self.staging)
        self.staging = None
        for directory in self.created_parents:
            try:
                os.rmdir(directory)
            except OSError:
                break
