/* tide.format._ccore: the compiled twins of Tide's per-message loops.
 *
 * Each function here has a pure-Python reference that gives the same results (the
 * differential tests in tests/format/test_ccore.py hold them equal); tide.format._core
 * picks this module unless TIDE_NO_EXTENSIONS=1 or it failed to import
 * (docs/performance.md, "The compiled core").
 *
 * The record layout is docs/formats.md's "Message record"; the offsets below are those of
 * its V1 magic, IPv4-hosts form (RECORD_HEADER_V4 in tide/format/_record.py), the only
 * form the run scan takes: anything else stops it and is left to the per-record path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define MESSAGE_MAGIC_V1 ((int32_t)0xDAA320A7)
#define FIXED_BYTES_V4 91
#define HEAD_V4_BYTES 88
#define WALK_BYTES 92 /* total_size + the 88 header bytes after it (tail/_batch.py) */
#define SYSFLAG_HOSTS_V6 ((1 << 4) | (1 << 5))
/* field positions in a V4 record */
#define POS_MAGIC 4
#define POS_BODY_CRC 8
#define POS_QUEUE_ID 12
#define POS_QUEUE_OFFSET 20
#define POS_PHYSICAL_OFFSET 28
#define POS_SYS_FLAG 36
#define POS_STORE_TIMESTAMP 56
#define POS_BODY_LEN 84

static inline int32_t be32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}

static inline uint32_t beu32(const unsigned char *p) { return (uint32_t)be32(p); }

static inline int64_t be64(const unsigned char *p) {
    return (int64_t)(((uint64_t)beu32(p) << 32) | (uint64_t)beu32(p + 4));
}

static inline unsigned be16(const unsigned char *p) { return ((unsigned)p[0] << 8) | p[1]; }

/* The growing array of the positions of the records taken. */
typedef struct {
    Py_ssize_t *items;
    Py_ssize_t count;
    Py_ssize_t capacity;
} Positions;

static int positions_add(Positions *ps, Py_ssize_t pos) {
    if (ps->count == ps->capacity) {
        Py_ssize_t capacity = ps->capacity ? ps->capacity * 2 : 1024;
        Py_ssize_t *items = PyMem_Realloc(ps->items, (size_t)capacity * sizeof(Py_ssize_t));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        ps->items = items;
        ps->capacity = capacity;
    }
    ps->items[ps->count++] = pos;
    return 0;
}

/* The topic of the record at p (V4, already bounds-checked), as a str: the previous
 * record's object when the bytes are the same (one topic is the usual case). NULL with
 * no error set: not UTF-8 (the scan stops there). NULL with an error: out of memory. */
static PyObject *topic_of(const unsigned char *topic, Py_ssize_t len, PyObject **last,
                          const unsigned char **last_bytes, Py_ssize_t *last_len) {
    if (*last != NULL && *last_len == len && memcmp(*last_bytes, topic, (size_t)len) == 0) {
        Py_INCREF(*last);
        return *last;
    }
    PyObject *text = PyUnicode_DecodeUTF8((const char *)topic, len, NULL);
    if (text == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            return NULL;
        }
        PyErr_Clear();
        return NULL;
    }
    Py_XDECREF(*last);
    Py_INCREF(text);
    *last = text;
    *last_bytes = topic;
    *last_len = len;
    return text;
}

typedef struct {
    const unsigned char *buf;
    Py_ssize_t end;
    long long base_offset;
    long long max_record_bytes;
    int check_crc;
} ScanArgs;

/* The size of the valid V1 IPv4 record at pos, or 0 when there is none (the checks of
 * ChunkScanner, in tide/tail/_batch.py). *topic_at and *props_at: where the topic and
 * the properties start. */
static Py_ssize_t check_record(const ScanArgs *a, Py_ssize_t pos, Py_ssize_t *topic_at,
                               Py_ssize_t *props_at) {
    const unsigned char *r = a->buf + pos;
    long long size = be32(r);
    if (size < FIXED_BYTES_V4 || size > a->end - pos) {
        return 0;
    }
    if (be32(r + POS_MAGIC) != MESSAGE_MAGIC_V1 || size > a->max_record_bytes ||
        (be32(r + POS_SYS_FLAG) & SYSFLAG_HOSTS_V6) ||
        be64(r + POS_PHYSICAL_OFFSET) != (int64_t)(a->base_offset + pos)) {
        return 0;
    }
    long long body_len = be32(r + POS_BODY_LEN);
    if (body_len < 0 || size - body_len < FIXED_BYTES_V4) {
        return 0;
    }
    Py_ssize_t topic_pos = HEAD_V4_BYTES + (Py_ssize_t)body_len;
    Py_ssize_t props = topic_pos + 3 + r[topic_pos];
    if (props > size || (Py_ssize_t)be16(r + props - 2) != size - props) {
        return 0;
    }
    if (a->check_crc &&
        crc32(0L, r + HEAD_V4_BYTES, (uInt)body_len) != beu32(r + POS_BODY_CRC)) {
        return 0;
    }
    *topic_at = topic_pos;
    *props_at = props;
    return (Py_ssize_t)size;
}

static PyObject *new_int_list(Py_ssize_t count) { return PyList_New(count); }

/* The columns of the records at ps (checked), in the order scan_v4_run returns them. */
static PyObject *columns(const ScanArgs *a, const Positions *ps, PyObject *topics,
                         const Py_ssize_t *props_starts, Py_ssize_t stop) {
    enum { POSITIONS, OFFSETS, SIZES, QUEUE_IDS, QUEUE_OFFSETS, SYS_FLAGS, STAMPS, PROPS, N };
    PyObject *lists[N] = {NULL};
    PyObject *result = NULL;
    Py_ssize_t n = ps->count;
    for (int c = 0; c < N; c++) {
        if ((lists[c] = new_int_list(n)) == NULL) {
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t pos = ps->items[i];
        Py_ssize_t next = i + 1 < n ? ps->items[i + 1] : stop;
        const unsigned char *r = a->buf + pos;
        PyObject *values[N] = {
            PyLong_FromSsize_t(pos),
            PyLong_FromLongLong(a->base_offset + pos),
            PyLong_FromSsize_t(next - pos),
            PyLong_FromLong(be32(r + POS_QUEUE_ID)),
            PyLong_FromLongLong(be64(r + POS_QUEUE_OFFSET)),
            PyLong_FromLong(be32(r + POS_SYS_FLAG)),
            PyLong_FromLongLong(be64(r + POS_STORE_TIMESTAMP)),
            PyLong_FromSsize_t(props_starts[i]),
        };
        for (int c = 0; c < N; c++) {
            if (values[c] == NULL) {
                for (int d = c; d < N; d++) {
                    Py_XDECREF(values[d]);
                }
                goto done;
            }
            PyList_SET_ITEM(lists[c], i, values[c]);
        }
    }
    result = Py_BuildValue("(nOOOOOOOOO)", stop, lists[POSITIONS], lists[OFFSETS], lists[SIZES],
                           lists[QUEUE_IDS], lists[QUEUE_OFFSETS], lists[SYS_FLAGS],
                           lists[STAMPS], topics, lists[PROPS]);
done:
    for (int c = 0; c < N; c++) {
        Py_XDECREF(lists[c]);
    }
    return result;
}

PyDoc_STRVAR(scan_v4_run_doc,
             "scan_v4_run(buf, start, end, base_offset, max_record_bytes, check_crc, window)\n"
             "--\n\n"
             "The whole, valid V1 IPv4 records of buf[start:end] that start in the window:\n"
             "(stop, positions, offsets, sizes, queue_ids, queue_offsets, sys_flags,\n"
             "store_timestamps, topics, props_starts); see tide/format/_ccore.pyi.");

static PyObject *scan_v4_run(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t start, end, window;
    long long base_offset, max_record_bytes;
    int check_crc;
    if (!PyArg_ParseTuple(args, "y*nnLLpn:scan_v4_run", &view, &start, &end, &base_offset,
                          &max_record_bytes, &check_crc, &window)) {
        return NULL;
    }
    if (start < 0 || end < start || end > view.len || window < 0) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError,
                            "scan_v4_run: need 0 <= start <= end <= len(buf) and window >= 0, "
                            "got start %zd, end %zd, len %zd, window %zd",
                            start, end, view.len, window);
    }
    ScanArgs a = {view.buf, end, base_offset, max_record_bytes, check_crc};
    Positions ps = {NULL, 0, 0};
    Py_ssize_t *props_starts = NULL;
    PyObject *topics = PyList_New(0);
    PyObject *last_topic = NULL;
    const unsigned char *last_bytes = NULL;
    Py_ssize_t last_len = 0;
    PyObject *result = NULL;
    Py_ssize_t pos = start;
    Py_ssize_t last = end - WALK_BYTES; /* (no overflow: window may be huge) */
    if (window < last - start) {
        last = start + window;
    }
    Positions props = {NULL, 0, 0};
    if (topics == NULL) {
        goto done;
    }
    while (pos <= last) {
        Py_ssize_t topic_at, props_at;
        Py_ssize_t size = check_record(&a, pos, &topic_at, &props_at);
        if (size == 0) {
            break;
        }
        PyObject *topic = topic_of(a.buf + pos + topic_at + 1, props_at - topic_at - 3,
                                   &last_topic, &last_bytes, &last_len);
        if (topic == NULL) {
            if (PyErr_Occurred()) {
                goto done;
            }
            break;
        }
        int failed = PyList_Append(topics, topic);
        Py_DECREF(topic);
        if (failed || positions_add(&ps, pos) || positions_add(&props, pos + props_at)) {
            goto done;
        }
        pos += size;
    }
    props_starts = props.items;
    result = columns(&a, &ps, topics, props_starts, pos);
done:
    PyMem_Free(ps.items);
    PyMem_Free(props.items);
    Py_XDECREF(topics);
    Py_XDECREF(last_topic);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_v4_run", scan_v4_run, METH_VARARGS, scan_v4_run_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tide.format._ccore",
    .m_doc = "The compiled twins of Tide's per-message loops (docs/performance.md).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__ccore(void) { return PyModule_Create(&module); }
