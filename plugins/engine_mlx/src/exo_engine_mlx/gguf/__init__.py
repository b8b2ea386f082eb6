"""GGUF import: llama-architecture GGUF files with byte-level BPE tokenizers to MLX.

Entry points: `import_gguf(gguf_path, out_dir, model_id)`, `gguf_model_card_fields(path)` and,
for the `exo import-gguf FILE --model-id ID` command, `import_gguf_cli(argv)`.
"""

from .cli import import_gguf_cli
from .convert import (
    CONVERTER_VERSION,
    MARKER_FILE,
    ModelCardFields,
    gguf_model_card_fields,
    import_gguf,
    read_marker,
)
from .reader import GGUFImportError

__all__ = [
    "CONVERTER_VERSION",
    "MARKER_FILE",
    "GGUFImportError",
    "ModelCardFields",
    "gguf_model_card_fields",
    "import_gguf",
    "import_gguf_cli",
    "read_marker",
]
