"""llama.cpp's own quantizer as the oracle of castor export --format gguf --type: llama_model_quantize of the pinned
node-llama-cpp's prebuilt libllama (what llama-quantize runs), reached through ctypes, without an importance matrix.

  llama_quantize.py IN.gguf OUT.gguf FTYPE   OUT as llama-quantize IN OUT FTYPE writes it (FTYPE: llama_ftype's number)
"""
import ctypes
import glob
import os
import sys

BINS = os.path.join(os.path.dirname(__file__), "..", "..", "third_party", "npm-llama-cpp", "node_modules",
                    "@node-llama-cpp", "linux-x64", "bins", "*", "libllama.v*.so")


class QuantizeParams(ctypes.Structure):
    """llama.h's llama_model_quantize_params of the pinned release (gitRelease.bundle's include/llama.h)."""
    _fields_ = [("nthread", ctypes.c_int32), ("ftype", ctypes.c_int), ("output_tensor_type", ctypes.c_int),
                ("token_embedding_type", ctypes.c_int), ("allow_requantize", ctypes.c_bool),
                ("quantize_output_tensor", ctypes.c_bool), ("only_copy", ctypes.c_bool), ("pure", ctypes.c_bool),
                ("keep_split", ctypes.c_bool), ("dry_run", ctypes.c_bool), ("imatrix", ctypes.c_void_p),
                ("kv_overrides", ctypes.c_void_p), ("tt_overrides", ctypes.c_void_p),
                ("prune_layers", ctypes.c_void_p), ("max_buf_size", ctypes.c_size_t)]


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    libs = glob.glob(BINS)
    if not libs:
        raise SystemExit(f"no {BINS} (scripts/setup_tests.sh installs node-llama-cpp)")
    lib = ctypes.CDLL(libs[0])
    lib.llama_model_quantize_default_params.restype = QuantizeParams
    lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(QuantizeParams)]
    lib.llama_model_quantize.restype = ctypes.c_uint32
    lib.llama_backend_init()
    params = lib.llama_model_quantize_default_params()
    params.nthread = 1
    params.ftype = int(sys.argv[3])
    if lib.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama_model_quantize {sys.argv[1]} failed")


if __name__ == "__main__":
    main()
