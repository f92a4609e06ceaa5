"""Build a trivial C extension the way Triton builds its kernel launchers (its own build function,
triton.runtime.build._build), then import and call it: what torch.compile's first kernel on a GPU
needs of an image, a C compiler and the interpreter's Python.h. No GPU needed.

    python docker/triton_build_check.py     # exit 0 and one line when it builds; 1 and why when not

Run inside the Docker GPU image by tests/servers/test_docker.py, and at build time of Modal's image
by modal_app.py."""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import sysconfig
import tempfile

SOURCE = r"""
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kokoro_triton_check", NULL, -1, methods};
PyMODINIT_FUNC PyInit_kokoro_triton_check(void) { return PyModule_Create(&module); }
"""


def main() -> int:
    try:
        from triton.runtime.build import _build
    except ImportError as error:
        print(f"triton build check: triton is not installed here ({error})")
        return 1
    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    with tempfile.TemporaryDirectory() as directory:
        source = os.path.join(directory, "main.c")
        with open(source, "w", encoding="utf-8") as f:
            f.write(SOURCE)
        # (name, src, srcdir, library_dirs, include_dirs, libraries), and empty lists for what later
        # Triton versions added after them (ccflags).
        extra = [[] for _ in list(inspect.signature(_build).parameters)[6:]]
        try:
            built = _build("kokoro_triton_check", source, directory, [], [], [], *extra)
        except Exception as error:  # noqa: BLE001 - the reason is the report
            print(f"triton build check: FAILED, {type(error).__name__}: {str(error).strip()[-600:]} "
                  f"(Python.h at {headers}: {'present' if os.path.exists(headers) else 'missing'})")
            return 1
        spec = importlib.util.spec_from_file_location("kokoro_triton_check", built)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if module.answer() != 42:
            print("triton build check: FAILED, the built module answered wrong")
            return 1
    import triton

    print(f"triton build check: ok, triton {triton.__version__} built and loaded a C extension against {headers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
