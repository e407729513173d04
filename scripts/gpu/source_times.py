#!/usr/bin/env python3
"""Keeps a build incremental across fresh copies of the source tree.

A copy of the tree gives every file a new modification time, after which ninja rebuilds everything.
`save` records each file's content hash and time once a build has succeeded; `restore`, before the
next build, gives every file whose content is unchanged its recorded time back (older than the
objects built from it), so that only what changed rebuilds. `restore` also removes the record: a
build that fails part-way leaves objects of contents the record does not know, and the build after
it starts from the copy's own times (everything rebuilds) rather than trust them.

    source_times.py save|restore TREE RECORD

Walks TREE following links to folders (a candidate tree links the dependencies), skipping build
folders, .git and __pycache__.
"""
import hashlib
import os
import sys

SKIP = (".git", "__pycache__")


def files(tree):
    for root, dirs, names in os.walk(tree, followlinks=True):
        dirs[:] = [d for d in dirs if d not in SKIP and not (root == tree and d.startswith("build"))]
        for name in names:
            path = os.path.join(root, name)
            if os.path.isfile(path):
                yield os.path.relpath(path, tree)


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save(tree, record):
    with open(record + ".tmp", "w") as out:
        for rel in sorted(files(tree)):
            path = os.path.join(tree, rel)
            out.write(f"{digest(path)} {os.stat(path).st_mtime_ns} {rel}\n")
    os.replace(record + ".tmp", record)


def restore(tree, record):
    if not os.path.exists(record):
        return 0
    kept = 0
    with open(record) as f:
        for line in f:
            sha, mtime, rel = line.rstrip("\n").split(" ", 2)
            path = os.path.join(tree, rel)
            if os.path.isfile(path) and digest(path) == sha:
                os.utime(path, ns=(int(mtime), int(mtime)))
                kept += 1
    os.remove(record)
    return kept


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("save", "restore"):
        sys.exit(__doc__)
    action, tree, record = sys.argv[1:]
    if action == "save":
        save(tree, record)
    else:
        print(f"source times: {restore(tree, record)} unchanged files keep the last build's times")


if __name__ == "__main__":
    main()
