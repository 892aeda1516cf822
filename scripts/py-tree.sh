# Sourced by the GPU scripts: make `import flashattn` work with CUDA. An installed package with the CUDA backend
# (pip install ./python) is used as it is; otherwise the package runs from the tree against $BUILD's library, its
# small call module _ext compiled into $BUILD/python-tree (torch must import, and Python's headers be present).
# In: BUILD, PY (the interpreter), LOG_DIR. Out: PYTHONPATH, FLASHATTN_LIBRARY exported; py_cuda says if it worked.
py_cuda() { "$PY" -c "import torch, flashattn._torch as t; assert t.torch.cuda.is_available() and \
    t._capi.backend_available(t._capi.BACKEND_CUDA)" >/dev/null 2>&1; }
if ! py_cuda && "$PY" -c "import torch" >/dev/null 2>&1; then
  PKG="$BUILD/python-tree"
  rm -rf "$PKG" && mkdir -p "$PKG" && cp -r python/flashattn "$PKG/"
  read -r PYINC PYSUFFIX < <("$PY" -c "import sysconfig as s; print(s.get_paths()['include'], s.get_config_var('EXT_SUFFIX'))")
  if ${CC:-cc} -shared -fPIC -O2 -Iinclude -I"$PYINC" python/flashattn/_ext.c -o "$PKG/flashattn/_ext$PYSUFFIX" \
       >"$LOG_DIR/python-ext.log" 2>&1; then
    export PYTHONPATH="$PWD/$PKG${PYTHONPATH:+:$PYTHONPATH}" FLASHATTN_LIBRARY="$PWD/$BUILD/libflashattn.so"
  fi
fi
