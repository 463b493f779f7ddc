/*
 * appbridge.media._ratecv: the sample-rate converter of the media path, in C.
 *
 * ratecv(data, inrate, outrate, state) -> (bytes, state)
 *
 * Converts mono signed 16-bit PCM (native byte order) from inrate to outrate Hz. It produces
 * exactly what audioop.ratecv(data, 2, 1, inrate, outrate, state) produces (weights 1 and 0:
 * linear interpolation between neighbouring input samples, no filter) and keeps its state in the
 * same form, (d, ((prev, cur),)), so the two can take turns on one stream. Why it exists:
 * audioop works in double precision for every output sample and parses its arguments with a
 * format string; the gateway converts every frame of every call (8 kHz carriers to 16 kHz apps
 * and back), where this integer version is several times faster (docs/PERFORMANCE.md). It also
 * outlives audioop, which Python 3.13 removes.
 *
 * Exactness: audioop computes (int)((prev * d + cur * (outrate - d)) / (double)outrate) with
 * samples scaled to 32 bits. Here the numerator is the same integer, exact in 64 bits, and C's
 * integer division truncates toward zero as the cast does. The two quotients could only differ
 * if rounding the double quotient crossed an integer, which needs outrate above 2^22 after the
 * rates are divided by their greatest common divisor; rates above 2^22 Hz are refused.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_RATE_HZ (1L << 22)

static long
gcd_long(long a, long b)
{
    while (b != 0) {
        long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static int
rate_arg(PyObject *obj, const char *name, long *out)
{
    long value = PyLong_AsLong(obj);
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (value <= 0 || value > MAX_RATE_HZ) {
        PyErr_Format(PyExc_ValueError, "%s must be within 1..%ld Hz", name, MAX_RATE_HZ);
        return -1;
    }
    *out = value;
    return 0;
}

/* (d, ((prev, cur),)) -> d, prev, cur; a ValueError for anything else. */
static int
parse_state(PyObject *state, long *d, long *prev, long *cur)
{
    PyObject *channels, *pair;
    if (!PyTuple_Check(state) || PyTuple_GET_SIZE(state) != 2) {
        goto bad;
    }
    channels = PyTuple_GET_ITEM(state, 1);
    if (!PyTuple_Check(channels) || PyTuple_GET_SIZE(channels) != 1) {
        goto bad;
    }
    pair = PyTuple_GET_ITEM(channels, 0);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        goto bad;
    }
    *d = PyLong_AsLong(PyTuple_GET_ITEM(state, 0));
    *prev = PyLong_AsLong(PyTuple_GET_ITEM(pair, 0));
    *cur = PyLong_AsLong(PyTuple_GET_ITEM(pair, 1));
    if (PyErr_Occurred()) {
        return -1;
    }
    if (*prev < INT32_MIN || *prev > INT32_MAX || *cur < INT32_MIN || *cur > INT32_MAX) {
        goto bad;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "illegal state argument");
    return -1;
}

static PyObject *
ratecv(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    long inrate, outrate, divisor, d, prev = 0, cur = 0;
    Py_ssize_t frames, bound, written = 0;
    PyObject *out;
    const unsigned char *src;
    int16_t *dst;

    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "ratecv(data, inrate, outrate, state) takes 4 arguments");
        return NULL;
    }
    if (rate_arg(args[1], "inrate", &inrate) < 0 || rate_arg(args[2], "outrate", &outrate) < 0) {
        return NULL;
    }
    divisor = gcd_long(inrate, outrate);
    inrate /= divisor;
    outrate /= divisor;
    if (args[3] == Py_None) {
        d = -outrate;
    }
    else if (parse_state(args[3], &d, &prev, &cur) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (view.len % 2 != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "not a whole number of frames");
        return NULL;
    }
    frames = view.len / 2;
    /* Each input sample adds outrate to d, each output takes inrate away; d starts below 0. */
    if (frames > (PY_SSIZE_T_MAX / 2 - 2) / outrate) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    bound = frames * outrate / inrate + 2;
    out = PyBytes_FromStringAndSize(NULL, bound * 2);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    src = (const unsigned char *)view.buf;
    dst = (int16_t *)PyBytes_AS_STRING(out);

    for (;;) {
        while (d < 0) {
            int16_t sample;
            if (frames == 0) {
                goto done;
            }
            memcpy(&sample, src, 2);
            src += 2;
            frames--;
            prev = cur;
            cur = (long)((int32_t)sample * 65536);
            d += outrate;
        }
        while (d >= 0) {
            int64_t num = (int64_t)prev * d + (int64_t)cur * (outrate - d);
            int64_t q;
            /* The telephony ratios (1:2, 2:1, 1:3, 3:1) reduce to a divisor of 1, 2 or 3. */
            if (outrate == 1) {
                q = num;
            }
            else if (outrate == 2) {
                q = num / 2;
            }
            else if (outrate == 3) {
                q = num / 3;
            }
            else {
                q = num / outrate;
            }
            if (written >= bound) { /* cannot happen (see bound); never write past it */
                goto done;
            }
            /* Arithmetic shift of the 32-bit value, as audioop's SETSAMPLE32 does. */
            dst[written++] = (int16_t)(((int32_t)q) >> 16);
            d -= inrate;
        }
    }
done:
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&out, written * 2) < 0) {
        return NULL;
    }
    return Py_BuildValue("(N(l((ll))))", out, d, prev, cur);
}

static PyMethodDef methods[] = {
    {"ratecv", (PyCFunction)(void (*)(void))ratecv, METH_FASTCALL,
     "ratecv(data, inrate, outrate, state) -> (bytes, state): mono 16-bit PCM from inrate to "
     "outrate Hz, as audioop.ratecv(data, 2, 1, inrate, outrate, state) does."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "appbridge.media._ratecv",
    "The media path's sample-rate converter (appbridge/media/_ratecv.c).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__ratecv(void)
{
    return PyModule_Create(&module_def);
}
