# Sourced by the other scripts: make sure uv is here and the workspace is installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.local/bin:$PATH"
if ! command -v uv >/dev/null 2>&1; then
  echo "installing uv (from PyPI)..." >&2
  python3 -m pip install --quiet --user uv 2>/dev/null || python3 -m pip install --quiet uv
fi
# Builds every workspace member, including the Rust libp2p wheel, and installs dev tools.
uv sync --all-packages --locked --quiet
