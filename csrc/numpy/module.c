/* rmsnorm._core: imports NumPy, adds the gufuncs and the thread controls. */
#define RMS_IMPORTS_NUMPY
#include "numpy_api.h"

#include <limits.h>
#include <string.h>

#include "../kernels/kernels.h"
#include "../kernels/thread_pool.h"
#include "buffers.h"
#include "gufuncs.h"

static PyObject *set_num_threads(PyObject *self, PyObject *arg)
{
    (void)self;
    /* Any integer, as operator.index takes it (NumPy's too), but no bool. */
    if (PyBool_Check(arg) || !PyIndex_Check(arg)) {
        return PyErr_Format(PyExc_TypeError,
                            "set_num_threads() expects an int number of threads, got %.100s",
                            Py_TYPE(arg)->tp_name);
    }
    PyObject *index = PyNumber_Index(arg);
    if (index == NULL) {
        return NULL;
    }
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow < 0 || (overflow == 0 && n < 1)) {
        return PyErr_Format(PyExc_ValueError,
                            "set_num_threads() expects a positive number of threads, got %R", arg);
    }
    rms_pool_set_num_threads(overflow > 0 ? LLONG_MAX : n); /* the pool caps it */
    Py_RETURN_NONE;
}

static PyObject *get_num_threads(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLong(rms_pool_get_num_threads());
}

static PyObject *isa_info(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyObject *supported = PyList_New(0);
    if (supported == NULL) {
        return NULL;
    }
    for (int isa = 0; isa < RMS_NUM_ISAS; isa++) {
        if (rms_isa_supported((rms_isa)isa)) {
            PyObject *name = PyUnicode_FromString(rms_isa_name((rms_isa)isa));
            if (name == NULL || PyList_Append(supported, name) < 0) {
                Py_XDECREF(name);
                Py_DECREF(supported);
                return NULL;
            }
            Py_DECREF(name);
        }
    }
    return Py_BuildValue("sN", rms_isa_name(rms_active_isa()), supported);
}

static PyObject *set_isa(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *requested = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (requested == NULL) {
        return PyErr_Format(PyExc_TypeError, "_set_isa() expects a str");
    }
    for (int isa = 0; isa < RMS_NUM_ISAS; isa++) {
        if (strcmp(requested, rms_isa_name((rms_isa)isa)) == 0) {
            if (!rms_force_isa((rms_isa)isa)) {
                return PyErr_Format(PyExc_ValueError, "this CPU cannot run the %s kernels",
                                    requested);
            }
            Py_RETURN_NONE;
        }
    }
    return PyErr_Format(PyExc_ValueError, "unknown instruction set %R", arg);
}

static PyObject *register_bfloat16(PyObject *module, PyObject *arg)
{
    PyArray_Descr *descr = NULL;
    if (!PyArray_DescrConverter(arg, &descr)) {
        return NULL;
    }
    int type_num = descr->type_num;
    int ok = PyDataType_ELSIZE(descr) == 2 && PyTypeNum_ISUSERDEF(type_num);
    Py_DECREF(descr);
    if (!ok) {
        return PyErr_Format(PyExc_TypeError, "_register_bfloat16() expects ml_dtypes.bfloat16");
    }
    if (rms_register_bfloat16(module, type_num) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "bfloat16 loops are registered for another dtype");
        }
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"set_num_threads", set_num_threads, METH_O,
     "set_num_threads($module, n, /)\n--\n\n"
     "Use at most n threads (n >= 1) in each forward or backward call.\n"
     "Results are the same bytes for any n. The default is the environment\n"
     "variable RMSNORM_NUM_THREADS, read when rmsnorm is imported, else the\n"
     "number of CPUs this process may run on; values past the pool's cap of\n"
     "256 threads mean 256."},
    {"get_num_threads", get_num_threads, METH_NOARGS,
     "get_num_threads($module, /)\n--\n\n"
     "The most threads a forward or backward call uses.\n\n"
     "Set by set_num_threads, else the environment variable\n"
     "RMSNORM_NUM_THREADS (read when rmsnorm is imported), else the CPUs\n"
     "this process may run on."},
    {"_isa", isa_info, METH_NOARGS,
     "_isa() -> (active, supported)\n\n"
     "The instruction set the kernels run on, and those this CPU supports."},
    {"_set_isa", set_isa, METH_O,
     "_set_isa(name, /)\n\n"
     "Runs the kernels on another supported instruction set (for tests).\n"
     "When rmsnorm is imported, the environment variable RMSNORM_ISA does\n"
     "the same (rmsnorm/_environment.py)."},
    {"_forward_direct", (PyCFunction)(void (*)(void))rms_forward_direct, METH_FASTCALL,
     "_forward_direct(x, weight, eps, /) -> y or None\n\n"
     "forward(x, weight, eps) without the ufunc machinery, for plain arrays\n"
     "already in a loop's dtypes; None for anything else (rms_norm's fast path)."},
    {"_forward_buffers", (PyCFunction)(void (*)(void))rms_forward_buffers, METH_FASTCALL,
     "_forward_buffers(type, rows, n, eps, weight_offset, x, weight, y, residual, residual_out, /)\n\n"
     "The forward kernels on raw buffers, for rmsnorm.torch (csrc/numpy/buffers.c):\n"
     "matrices are (address, row stride, stride), vectors (address, stride), in\n"
     "bytes; residual and residual_out may be None. Nothing is checked but the\n"
     "shape numbers: wrong addresses crash the process."},
    {"_backward_buffers", (PyCFunction)(void (*)(void))rms_backward_buffers, METH_FASTCALL,
     "_backward_buffers(type, rows, n, eps, weight_offset, grad_output, x, weight,\n"
     "                  grad_input, grad_weight, grad_residual_out, /)\n\n"
     "The backward kernels on raw buffers, as _forward_buffers."},
    {"_advise_huge_pages", (PyCFunction)(void (*)(void))rms_advise_huge_pages, METH_FASTCALL,
     "_advise_huge_pages(address, nbytes, /)\n\n"
     "Asks for transparent huge pages over the whole pages of a buffer, as\n"
     "NumPy does for its large arrays (rmsnorm.torch's new outputs). A hint:\n"
     "nothing changes where the OS does not take it."},
    {"_register_bfloat16", register_bfloat16, METH_O,
     "_register_bfloat16(dtype, /)\n\n"
     "Adds the bfloat16 loops to forward and backward for ml_dtypes.bfloat16.\n"
     "rmsnorm calls it on import when ml_dtypes is installed."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rmsnorm._core",
    .m_doc = "RMSNorm forward and backward as NumPy generalized ufuncs.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__core(void)
{
    import_array();
    import_umath();
    rms_select_isa();
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    PyObject *pairs = rms_dtype_pairs();
    if (rms_add_gufuncs(module) < 0 || pairs == NULL ||
        PyModule_AddObject(module, "dtype_pairs", pairs) < 0) {
        Py_XDECREF(pairs);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
