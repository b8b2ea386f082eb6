# Sourced by the other scripts: make sure uv is here and the workspace is installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.local/bin:$PATH"
if ! command -v uv >/dev/null 2>&1; then
  echo "installing uv (from PyPI)..." >&2
  # Debian 12+, Ubuntu 23.04+ and Homebrew mark their Python externally managed (PEP 668): a
  # user install of one tool is what --break-system-packages allows.
  python3 -m pip install --quiet --user uv 2>/dev/null \
    || python3 -m pip install --quiet --user --break-system-packages uv 2>/dev/null \
    || python3 -m pip install --quiet uv \
    || { echo "could not install uv with pip: install uv (pipx install uv, or your system's" \
      "package) or pip (python3-pip), then run this again" >&2; exit 1; }
fi
# Builds every workspace member, including the Rust libp2p wheel, and installs dev tools.
# The first run compiles Rust and C++ for a few minutes: say so, and show uv's progress.
if [ ! -x .venv/bin/exo ]; then
  echo "installing exo into .venv (the first time builds the Rust libp2p wheel and the C++" >&2
  echo "kernels: about 3 minutes on 2 cores)..." >&2
  uv sync --all-packages --locked
else
  uv sync --all-packages --locked --quiet
fi
