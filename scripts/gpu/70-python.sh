#!/usr/bin/env bash
# The installed package's whole pytest suite (GPU tests included), the README's Python snippet and
# the Hugging Face example. Needs the python-install step's package (TILEATTN_GPU_STEPS="python-install
# python" in one go).
set -uo pipefail
site=$BUILD/python-site
[ -d "$site/tileattn" ] || { echo "no package in $site: run the python-install step first" >&2; exit 1; }
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
cd "$ROOT"
python3 -m pytest tests/python -q -p no:cacheprovider >"$OUT/python-test.log" 2>&1
rc=$?
tail -n 3 "$OUT/python-test.log" | sed 's/^/pytest: /' | tee -a "$OUT/summary.txt"
# The README's Python snippet, exactly as a newcomer would paste it.
python3 -c 'import re; src = open("README.md").read()
exec(compile(re.search(r"## Python\n\n```python\n(.*?)```", src, re.S).group(1), "README.md", "exec"))' \
  >"$OUT/readme-snippet.log" 2>&1 || rc=1
tail -n 2 "$OUT/readme-snippet.log" | sed 's/^/README snippet: /' | tee -a "$OUT/summary.txt"
python3 examples/hf_llama.py >"$OUT/hf-llama.log" 2>&1 || rc=1
tail -n 4 "$OUT/hf-llama.log" | sed 's/^/hf example: /' | tee -a "$OUT/summary.txt"
exit $rc
