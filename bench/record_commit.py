"""The commit a benchmark record names: TILEATTN_COMMIT where the caller sets it (a copy of the tree
whose .git is missing or is not the tree's own, as on a machine the tree was copied to), else the
checkout's HEAD (with "-dirty" where tracked files differ from it), else None."""
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def record_commit():
    if os.environ.get("TILEATTN_COMMIT"):
        return os.environ["TILEATTN_COMMIT"]
    try:
        res = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        return None
    if res.returncode != 0:
        return None
    clean = subprocess.run(["git", "-C", REPO, "diff", "--quiet", "HEAD", "--"], capture_output=True).returncode == 0
    return res.stdout.strip() + ("" if clean else "-dirty")


if __name__ == "__main__":  # for shell scripts (scripts/gpu_check.sh)
    print(record_commit() or "unknown")
