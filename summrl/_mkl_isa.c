/* MKL asks this function whether the processor is Intel's, and on any other runs its AVX2 kernels even where the
   processor has AVX-512. Loaded into the process's global symbols before PyTorch (summrl/mkl_isa.py), this definition
   is the one MKL calls: it answers yes, and MKL picks its kernels by the instruction sets the processor reports. */
#include <Python.h>

int mkl_serv_intel_cpu_true(void) { return 1; }

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_mkl_isa", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__mkl_isa(void) { return PyModule_Create(&module); }
