"""exo plugin: image generation with mflux."""

import importlib.util
import sys
from pathlib import Path

# A built wheel carries mflux in _vendor (its own metadata would pull torch and CUDA MLX; see
# docs/packaging.md). An installed mflux, as in the workspace, is used first.
_VENDOR = Path(__file__).parent / "_vendor"
if _VENDOR.is_dir() and importlib.util.find_spec("mflux") is None:
    sys.path.append(str(_VENDOR))
