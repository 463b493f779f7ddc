/*
 * appbridge.media._lowpass: the anti-aliasing filter of the media path, in C.
 *
 * Lowpass(coefficients) -> filter; filter.filter(data) -> bytes; filter.reset()
 *
 * A streaming FIR filter over mono signed 16-bit PCM (native byte order). `coefficients` are
 * the taps as native int16 in Q14 (16384 is a gain of one), from appbridge/media/antialias.py,
 * which designs them and explains why they are needed: linear interpolation (ratecv) keeps
 * every component above the new rate's Nyquist frequency and folds it into the band.
 *
 * Each output sample is sum(h[j] * x[n - ntaps + 1 + j]) rounded half up, then saturated to
 * 16 bits. The last ntaps - 1 input samples are kept between calls, so a stream gives the same
 * samples whatever its chunking. The accumulator is 32 bits: the constructor refuses taps whose
 * absolute sum reaches 65536 (a gain of 4), which bounds every sum below 2^31.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_TAPS 1024
#define BLOCK 160 /* samples filtered per pass: a small buffer that never grows */

typedef struct {
    PyObject_HEAD
    Py_ssize_t ntaps;
    int16_t *taps;
    int16_t *work; /* ntaps - 1 samples of history, then room for BLOCK samples */
} Lowpass;

static void
lowpass_dealloc(Lowpass *self)
{
    PyMem_Free(self->taps);
    PyMem_Free(self->work);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
lowpass_init(Lowpass *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"coefficients", NULL};
    Py_buffer coef;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*", kwlist, &coef)) {
        return -1;
    }
    Py_ssize_t ntaps = coef.len / 2;
    if (coef.len % 2 != 0 || ntaps < 1 || ntaps > MAX_TAPS) {
        PyBuffer_Release(&coef);
        PyErr_Format(PyExc_ValueError, "coefficients must be 1 to %d int16 taps", MAX_TAPS);
        return -1;
    }
    int16_t *taps = PyMem_Malloc(coef.len);
    int16_t *work = PyMem_Calloc(ntaps - 1 + BLOCK, sizeof(int16_t));
    if (taps == NULL || work == NULL) {
        PyMem_Free(taps);
        PyMem_Free(work);
        PyBuffer_Release(&coef);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(taps, coef.buf, coef.len);
    PyBuffer_Release(&coef);
    long gain = 0;
    for (Py_ssize_t j = 0; j < ntaps; j++) {
        gain += taps[j] < 0 ? -(long)taps[j] : taps[j];
    }
    if (gain >= 65536) {
        PyMem_Free(taps);
        PyMem_Free(work);
        PyErr_SetString(PyExc_ValueError, "the taps' absolute sum must stay below 65536");
        return -1;
    }
    PyMem_Free(self->taps);
    PyMem_Free(self->work);
    self->ntaps = ntaps;
    self->taps = taps;
    self->work = work;
    return 0;
}

static void
filter_block(Lowpass *self, const int16_t *x, Py_ssize_t n, int16_t *y)
{
    Py_ssize_t keep = self->ntaps - 1;
    const int16_t *h = self->taps;
    int16_t *w = self->work;
    memcpy(w + keep, x, n * sizeof(int16_t));
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t acc = 1 << 13;
        for (Py_ssize_t j = 0; j <= keep; j++) {
            acc += (int32_t)h[j] * w[i + j];
        }
        acc >>= 14;
        y[i] = (int16_t)(acc > 32767 ? 32767 : acc < -32768 ? -32768 : acc);
    }
    memmove(w, w + n, keep * sizeof(int16_t));
}

static int
initialised(Lowpass *self)
{
    if (self->taps == NULL) {
        PyErr_SetString(PyExc_ValueError, "Lowpass.__init__ was not called");
        return 0;
    }
    return 1;
}

static PyObject *
lowpass_filter(Lowpass *self, PyObject *arg)
{
    Py_buffer data;
    if (!initialised(self)) {
        return NULL;
    }
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (data.len % 2 != 0) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "data must hold whole 16-bit samples");
        return NULL;
    }
    Py_ssize_t n = data.len / 2;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 2);
    if (out == NULL) {
        PyBuffer_Release(&data);
        return NULL;
    }
    const int16_t *x = (const int16_t *)data.buf;
    int16_t *y = (int16_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t done = 0; done < n; done += BLOCK) {
        filter_block(self, x + done, n - done < BLOCK ? n - done : BLOCK, y + done);
    }
    PyBuffer_Release(&data);
    return out;
}

static PyObject *
lowpass_reset(Lowpass *self, PyObject *Py_UNUSED(ignored))
{
    if (!initialised(self)) {
        return NULL;
    }
    memset(self->work, 0, (self->ntaps - 1) * sizeof(int16_t));
    Py_RETURN_NONE;
}

static PyMethodDef lowpass_methods[] = {
    {"filter", (PyCFunction)lowpass_filter, METH_O,
     "filter(data) -> bytes: the next chunk of the stream, filtered."},
    {"reset", (PyCFunction)lowpass_reset, METH_NOARGS,
     "reset(): forget the history, as at the start of a stream."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LowpassType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "appbridge.media._lowpass.Lowpass",
    .tp_doc = "A streaming FIR filter over 16-bit PCM with Q14 taps.",
    .tp_basicsize = sizeof(Lowpass),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)lowpass_init,
    .tp_dealloc = (destructor)lowpass_dealloc,
    .tp_methods = lowpass_methods,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "appbridge.media._lowpass",
    .m_doc = "The anti-aliasing filter of the media path (appbridge/media/antialias.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__lowpass(void)
{
    if (PyType_Ready(&LowpassType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "Lowpass", (PyObject *)&LowpassType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
