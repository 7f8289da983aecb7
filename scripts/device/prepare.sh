#!/usr/bin/env bash
# Make .devcheck/ for scripts/device/ab_second_machine.sh: SmolLM2-135M-Instruct's config and
# tokenizer files (no weights) and the planted diff. The device's own torch and transformers run
# (its Python 3.12 image has them; their versions go into environment.txt); a wheel put in
# .devcheck/whl/ by hand is installed there first.
# Run here, in the repository root, with .venv active; .devcheck/ must be in .git/info/exclude.
set -euo pipefail
DC=.devcheck
rm -rf "$DC"; mkdir -p "$DC/smollm2-shape"
mkdir -p .git/info; grep -qsx '/.devcheck/' .git/info/exclude || echo '/.devcheck/' >> .git/info/exclude
python - "$DC/smollm2-shape" <<'PY'
import shutil, sys
from pathlib import Path
from reference_engine.model_loading import resolve_model
_, folder = resolve_model(None)
for f in folder.iterdir():
    if f.suffix != ".safetensors" and f.is_file() and f.stat().st_size < 8 << 20:
        shutil.copy(f, Path(sys.argv[1]) / f.name)
PY
cp "${PLANT_DIFF:?set PLANT_DIFF to the planted slowdown diff}" "$DC/slow15.diff"
du -sh "$DC"; ls "$DC"/*
