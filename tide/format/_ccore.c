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
#include <unistd.h>
#include <zlib.h>

#include "_crc32.h" /* body_crc (s25-core) */

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

/* The growable arrays' one way to grow: `items`, full with its `room` items of item_bytes
 * each, reallocated to hold one more (the room doubled, or first_room when it has none
 * yet; the new room in *new_room). NULL with MemoryError set when out of memory or when
 * the new size would overflow: then `items` is unchanged and still the caller's to free
 * (so a caller growing parallel arrays can stop at the first failure). */
static void *grow_full(void *items, Py_ssize_t room, size_t item_bytes, Py_ssize_t first_room,
                       Py_ssize_t *new_room) {
    if (room > PY_SSIZE_T_MAX / 2) {
        PyErr_NoMemory();
        return NULL;
    }
    Py_ssize_t grown = room ? room * 2 : first_room;
    if ((size_t)grown > (size_t)PY_SSIZE_T_MAX / item_bytes) {
        PyErr_NoMemory();
        return NULL;
    }
    void *bigger = PyMem_Realloc(items, (size_t)grown * item_bytes);
    if (bigger == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    *new_room = grown;
    return bigger;
}

/* The growing array of the positions of the records taken. */
typedef struct {
    Py_ssize_t *items;
    Py_ssize_t count;
    Py_ssize_t capacity;
} Positions;

static int positions_add(Positions *ps, Py_ssize_t pos) {
    if (ps->count == ps->capacity) {
        Py_ssize_t capacity = 0;
        Py_ssize_t *items =
            grow_full(ps->items, ps->capacity, sizeof(Py_ssize_t), 1024, &capacity);
        if (items == NULL) {
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
        body_crc(r + HEAD_V4_BYTES, (size_t)body_len) != beu32(r + POS_BODY_CRC)) {
        return 0;
    }
    *topic_at = topic_pos;
    *props_at = props;
    return (Py_ssize_t)size;
}

/* -- int64 columns (issue 21: a batch's integer columns without an object a value) -----
 * The scan answers each integer column as an array('q') (a buffer of int64: 8 bytes a
 * value, no int object made, freed or chased a record); the calls that read columns take
 * an array('q') or a list of ints alike (the pure-Python path and the tests pass lists).
 * A column of any other kind (or an array of another typecode) is read as a sequence. */

static PyObject *array_type = NULL; /* array.array, imported at module init */

/* A new array('q') holding the count values of v. */
static PyObject *int64_array(const long long *v, Py_ssize_t count) {
    PyObject *raw = PyBytes_FromStringAndSize((const char *)v, count * (Py_ssize_t)sizeof(*v));
    if (raw == NULL) {
        return NULL;
    }
    PyObject *out = PyObject_CallFunction(array_type, "CO", 'q', raw);
    Py_DECREF(raw);
    return out;
}

/* 1 when col is a C-contiguous buffer of signed 8-byte integers (array('q'); 'l' where
 * a long is 8 bytes): *view then holds it (release it); 0 (no exception) otherwise. */
static int int64_view(PyObject *col, Py_buffer *view) {
    if (PyList_CheckExact(col) || PyTuple_CheckExact(col) || !PyObject_CheckBuffer(col)) {
        return 0;
    }
    if (PyObject_GetBuffer(col, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = view->format;
    if (view->itemsize == 8 && view->ndim == 1 && f != NULL &&
        (strcmp(f, "q") == 0 || (strcmp(f, "l") == 0 && sizeof(long) == 8))) {
        return 1;
    }
    PyBuffer_Release(view);
    return 0;
}

/* The length of an int64 buffer column, or of an exact list; -1 (no exception) for
 * anything else. */
static Py_ssize_t column_length(PyObject *col) {
    if (PyList_CheckExact(col)) {
        return PyList_GET_SIZE(col);
    }
    Py_buffer view;
    if (!int64_view(col, &view)) {
        return -1;
    }
    Py_ssize_t n = view.len / 8;
    PyBuffer_Release(&view);
    return n;
}

/* The count values of an int64 buffer column into out: 1, or 0 (no exception) when col
 * is not one or holds another number of values. */
static int int64_column(PyObject *col, long long *out, Py_ssize_t count) {
    Py_buffer view;
    if (!int64_view(col, &view)) {
        return 0;
    }
    int ok = view.len == count * 8;
    if (ok) {
        memcpy(out, view.buf, (size_t)count * 8);
    }
    PyBuffer_Release(&view);
    return ok;
}

/* Any integer column (an int64 buffer, else any sequence of ints) as a new C array of
 * long long (PyMem_Free it), its length in *length; NULL with an exception when it is
 * neither (what: the TypeError's message) or an int does not fit. */
static long long *int64_values(PyObject *col, Py_ssize_t *length, const char *what) {
    Py_buffer view;
    if (int64_view(col, &view)) {
        Py_ssize_t n = view.len / 8;
        long long *out = PyMem_Malloc((size_t)(n + 1) * 8);
        if (out == NULL) {
            PyErr_NoMemory();
        } else {
            memcpy(out, view.buf, (size_t)n * 8);
            *length = n;
        }
        PyBuffer_Release(&view);
        return out;
    }
    PyObject *seq = PySequence_Fast(col, what);
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    long long *out = PyMem_Malloc((size_t)(n + 1) * 8);
    if (out == NULL) {
        PyErr_NoMemory();
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if (out[i] == -1 && PyErr_Occurred()) {
                PyMem_Free(out);
                out = NULL;
                break;
            }
        }
        if (out != NULL) {
            *length = n;
        }
    }
    Py_DECREF(seq);
    return out;
}

/* The columns of the records at ps (checked), in the order scan_v4_run returns them: the
 * integer columns as array('q') (see "int64 columns" above), the topics as given. */
static PyObject *columns(const ScanArgs *a, const Positions *ps, PyObject *topics,
                         const Py_ssize_t *props_starts, Py_ssize_t stop) {
    enum { POSITIONS, OFFSETS, SIZES, QUEUE_IDS, QUEUE_OFFSETS, SYS_FLAGS, STAMPS, PROPS, N };
    PyObject *arrays[N] = {NULL};
    PyObject *result = NULL;
    Py_ssize_t n = ps->count;
    long long *v = PyMem_Malloc(sizeof(long long) * (size_t)(N * n + 1));
    if (v == NULL) {
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t pos = ps->items[i];
        Py_ssize_t next = i + 1 < n ? ps->items[i + 1] : stop;
        const unsigned char *r = a->buf + pos;
        v[POSITIONS * n + i] = pos;
        v[OFFSETS * n + i] = a->base_offset + pos;
        v[SIZES * n + i] = next - pos;
        v[QUEUE_IDS * n + i] = be32(r + POS_QUEUE_ID);
        v[QUEUE_OFFSETS * n + i] = be64(r + POS_QUEUE_OFFSET);
        v[SYS_FLAGS * n + i] = be32(r + POS_SYS_FLAG);
        v[STAMPS * n + i] = be64(r + POS_STORE_TIMESTAMP);
        v[PROPS * n + i] = props_starts[i];
    }
    for (int c = 0; c < N; c++) {
        if ((arrays[c] = int64_array(v + c * n, n)) == NULL) {
            goto done;
        }
    }
    result = Py_BuildValue("(nOOOOOOOOO)", stop, arrays[POSITIONS], arrays[OFFSETS],
                           arrays[SIZES], arrays[QUEUE_IDS], arrays[QUEUE_OFFSETS],
                           arrays[SYS_FLAGS], arrays[STAMPS], topics, arrays[PROPS]);
done:
    PyMem_Free(v);
    for (int c = 0; c < N; c++) {
        Py_XDECREF(arrays[c]);
    }
    return result;
}

PyDoc_STRVAR(scan_v4_run_doc,
             "scan_v4_run(buf, start, end, base_offset, max_record_bytes, check_crc, window)\n"
             "--\n\n"
             "The whole, valid V1 IPv4 records of buf[start:end] that start in the window:\n"
             "(stop, positions, offsets, sizes, queue_ids, queue_offsets, sys_flags,\n"
             "store_timestamps, topics, props_starts), each integer column an array('q'),\n"
             "the topics a list; see tide/format/_ccore.pyi.");

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


/* -- dispatch_properties ---------------------------------------------------------- */

/* A value as bytes: the previous record's object when the bytes are the same (a batch's
 * records mostly share their TAGS). */
typedef struct {
    PyObject *object;
    const char *bytes;
    Py_ssize_t len;
} LastValue;

static PyObject *value_of(const char *p, Py_ssize_t len, LastValue *last) {
    if (last->object != NULL && last->len == len && memcmp(last->bytes, p, (size_t)len) == 0) {
        Py_INCREF(last->object);
        return last->object;
    }
    PyObject *value = PyBytes_FromStringAndSize(p, len);
    if (value == NULL) {
        return NULL;
    }
    Py_XSETREF(last->object, Py_NewRef(value));
    last->bytes = p;
    last->len = len;
    return value;
}

enum { KEYS, TAGS, UNIQ_KEY, NAMES };

/* Which wanted name an item's name is (KEYS, TAGS, UNIQ_KEY), or -1. */
static int wanted_name(const char *name, Py_ssize_t len) {
    if (len == 4 && memcmp(name, "KEYS", 4) == 0) {
        return KEYS;
    }
    if (len == 4 && memcmp(name, "TAGS", 4) == 0) {
        return TAGS;
    }
    if (len == 8 && memcmp(name, "UNIQ_KEY", 8) == 0) {
        return UNIQ_KEY;
    }
    return -1;
}

/* The last value of each wanted name in the properties p[0:len]: items split at \x02,
 * each at its first \x01 (an item without one is skipped), as decode_properties reads
 * them. found[n] is NULL when name n is absent. */
static void find_values(const char *p, Py_ssize_t len, const char *found[NAMES],
                        Py_ssize_t found_len[NAMES]) {
    for (int n = 0; n < NAMES; n++) {
        found[n] = NULL;
        found_len[n] = 0;
    }
    const char *end = p + len;
    while (p < end) {
        const char *item_end = memchr(p, '\x02', (size_t)(end - p));
        if (item_end == NULL) {
            item_end = end;
        }
        const char *sep = memchr(p, '\x01', (size_t)(item_end - p));
        if (sep != NULL) {
            int n = wanted_name(p, sep - p);
            if (n >= 0) {
                found[n] = sep + 1;
                found_len[n] = item_end - sep - 1;
            }
        }
        p = item_end + 1;
    }
}

/* Record i's properties bounds from the index columns, checked against the data: from
 * starts to ends, or (sizes not NULL) to ends[i] + sizes[i], ends then the records'
 * positions (the record ends, without a list of them made for the call). */
static int bounds_of(const long long *starts, const long long *ends, const long long *sizes,
                     Py_ssize_t i, Py_ssize_t size, long long *start, long long *end) {
    *start = starts[i];
    *end = ends[i];
    if (sizes != NULL) {
        long long record_size = sizes[i];
        if ((record_size > 0 && *end > LLONG_MAX - record_size) ||
            (record_size < 0 && *end < LLONG_MIN - record_size)) {
            *end = -1; /* (out of the data: refused below) */
        } else {
            *end += record_size;
        }
    }
    if (*start < 0 || *end < *start || *end > size) {
        PyErr_Format(PyExc_ValueError,
                     "dispatch_properties: record %zd's properties [%lld, %lld) are not inside "
                     "the data (%zd bytes)",
                     i, *start, *end, size);
        return -1;
    }
    return 0;
}

static int properties_rows(const char *data, Py_ssize_t size, const long long *starts,
                           const long long *ends, const long long *sizes, Py_ssize_t count,
                           PyObject *columns[NAMES]) {
    LastValue last[NAMES] = {{NULL, NULL, 0}, {NULL, NULL, 0}, {NULL, NULL, 0}};
    int failed = -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        long long start, end;
        if (bounds_of(starts, ends, sizes, i, size, &start, &end)) {
            goto done;
        }
        const char *found[NAMES];
        Py_ssize_t found_len[NAMES];
        find_values(data + start, end - start, found, found_len);
        for (int n = 0; n < NAMES; n++) {
            PyObject *value;
            if (found[n] == NULL && n == UNIQ_KEY) {
                value = Py_NewRef(Py_None);
            } else {
                value = value_of(found[n] ? found[n] : "", found_len[n], &last[n]);
                if (value == NULL) {
                    goto done;
                }
            }
            PyObject *placeholder = PyList_GET_ITEM(columns[n], i);
            PyList_SET_ITEM(columns[n], i, value);
            Py_DECREF(placeholder);
        }
    }
    failed = 0;
done:
    for (int n = 0; n < NAMES; n++) {
        Py_XDECREF(last[n].object);
    }
    return failed;
}

PyDoc_STRVAR(dispatch_properties_doc,
             "dispatch_properties(data, starts, ends, sizes=None)\n--\n\n"
             "(keys, tags, uniq_keys) of the properties at data[starts[i]:ends[i]]: the\n"
             "KEYS and TAGS values as bytes (b'' when absent), the UNIQ_KEY value or None.\n"
             "With sizes, ends are the records' positions and each ends at ends[i] +\n"
             "sizes[i]. The reference: services.dispatch.engine.batch_fields\n"
             ".properties_between (properties_of_records with sizes).");

static PyObject *dispatch_properties(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    PyObject *starts_in, *ends_in, *sizes_in = NULL;
    if (!PyArg_ParseTuple(args, "y*OO|O:dispatch_properties", &view, &starts_in, &ends_in,
                          &sizes_in)) {
        return NULL;
    }
    PyObject *result = NULL;
    PyObject *columns[NAMES] = {NULL};
    long long *sizes = NULL;
    Py_ssize_t count = 0, n_ends = 0, n_sizes = 0;
    long long *starts = int64_values(starts_in, &count,
                                     "dispatch_properties: starts: a sequence");
    long long *ends = starts ? int64_values(ends_in, &n_ends,
                                            "dispatch_properties: ends: a sequence")
                             : NULL;
    if (ends == NULL) {
        goto done;
    }
    if (sizes_in != NULL &&
        (sizes = int64_values(sizes_in, &n_sizes, "dispatch_properties: sizes: a sequence")) ==
            NULL) {
        goto done;
    }
    if (n_ends != count || (sizes != NULL && n_sizes != count)) {
        PyErr_Format(PyExc_ValueError, "dispatch_properties: %zd starts but %zd ends or sizes",
                     count, n_ends);
        goto done;
    }
    for (int n = 0; n < NAMES; n++) {
        if ((columns[n] = PyList_New(count)) == NULL) {
            goto done;
        }
        for (Py_ssize_t i = 0; i < count; i++) {  /* (a list must be whole if we fail) */
            PyList_SET_ITEM(columns[n], i, Py_NewRef(Py_None));
        }
    }
    if (properties_rows(view.buf, view.len, starts, ends, sizes, count, columns) == 0) {
        result = PyTuple_Pack(3, columns[KEYS], columns[TAGS], columns[UNIQ_KEY]);
    }
done:
    for (int n = 0; n < NAMES; n++) {
        Py_XDECREF(columns[n]);
    }
    PyMem_Free(starts);
    PyMem_Free(ends);
    PyMem_Free(sizes);
    PyBuffer_Release(&view);
    return result;
}

/* -- scan_run ----------------------------------------------------------------------- */

#define MESSAGE_MAGIC_V2 ((int32_t)0xDAA320AB)
#define SYSFLAG_BORN_HOST_V6 (1 << 4)
#define SYSFLAG_STORE_HOST_V6 (1 << 5)
#define HEAD_V6_BORN_BYTES 100 /* the header with a 20-byte born host */
#define RUN_COLUMNS 6

/* One record of a run: where its fields are, or 0 when it fails a check (the Python
 * reference then says which, in words). */
typedef struct {
    int64_t total, body_pos, topic_at, name_end;
    int32_t queue_id, sys_flag;
} RunRecord;

static int run_record(const unsigned char *d, int64_t at, int64_t end_of_run,
                      int64_t max_body_bytes, RunRecord *out) {
    if (at + HEAD_V4_BYTES > end_of_run) {
        return 0;
    }
    const unsigned char *r = d + at;
    int64_t total = be32(r), body_len = be32(r + POS_BODY_LEN);
    int32_t magic = be32(r + POS_MAGIC), sys_flag = be32(r + POS_SYS_FLAG);
    int64_t body_pos = at + HEAD_V4_BYTES;
    if (sys_flag & SYSFLAG_HOSTS_V6) {
        if (sys_flag & SYSFLAG_BORN_HOST_V6) {
            if (at + HEAD_V6_BORN_BYTES > end_of_run) {
                return 0;
            }
            body_len = be32(r + HEAD_V6_BORN_BYTES - 4);
            body_pos = at + HEAD_V6_BORN_BYTES;
        }
        if ((magic != MESSAGE_MAGIC_V1 && magic != MESSAGE_MAGIC_V2) ||
            (sys_flag & SYSFLAG_STORE_HOST_V6)) {
            return 0;
        }
    }
    int64_t end = at + total, topic_pos = body_pos + body_len, name_pos;
    if (magic == MESSAGE_MAGIC_V1 && body_len >= 0 && topic_pos < end && end <= end_of_run) {
        out->topic_at = topic_pos + 1;
        name_pos = out->topic_at + d[topic_pos];
    } else if (magic == MESSAGE_MAGIC_V2 && body_len >= 0 && topic_pos + 1 < end &&
               end <= end_of_run) {
        out->topic_at = topic_pos + 2;
        name_pos = out->topic_at + be16(d + topic_pos);
    } else {
        return 0;
    }
    /* name_pos: the position of the properties length */
    if (body_len > max_body_bytes || name_pos + 2 > end ||
        name_pos + 2 + (int64_t)be16(d + name_pos) != end ||
        body_crc(d + body_pos, (size_t)body_len) != beu32(r + POS_BODY_CRC) ||
        name_pos == out->topic_at) {
        return 0;
    }
    out->total = total;
    out->body_pos = body_pos;
    out->name_end = name_pos;
    out->queue_id = be32(r + POS_QUEUE_ID);
    out->sys_flag = sys_flag;
    return 1;
}

/* The value of a column's row: the previous row's object again when the value repeats
 * (runs of one shape repeat sizes and positions: no int made per record), else a new
 * int. NULL: out of memory. */
static PyObject *column_int(PyObject *previous, long long value) {
    if (previous != NULL && PyLong_AsLongLong(previous) == value) {
        return Py_NewRef(previous);
    }
    return PyLong_FromLongLong(value);
}

/* The columns of the checked records, each list made at its final length. */
static PyObject *run_columns(const RunRecord *recs, const int64_t *starts, Py_ssize_t count,
                             PyObject *const *topics) {
    PyObject *columns[RUN_COLUMNS] = {NULL};
    PyObject *result = NULL;
    for (int c = 0; c < RUN_COLUMNS; c++) {
        if ((columns[c] = PyList_New(count)) == NULL) {
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        const RunRecord *rec = &recs[i];
        PyObject *before[RUN_COLUMNS] = {NULL};
        if (i > 0) {
            for (int c = 0; c < RUN_COLUMNS; c++) {
                before[c] = PyList_GET_ITEM(columns[c], i - 1);
            }
        }
        PyObject *values[RUN_COLUMNS] = {
            PyLong_FromLongLong(starts[i]),
            column_int(before[1], rec->total),
            Py_NewRef(topics[i]),
            column_int(before[3], rec->queue_id),
            column_int(before[4], rec->sys_flag),
            /* store_timestamp: 32 bytes before the body */
            column_int(before[5], rec->body_pos - starts[i] - 32),
        };
        int failed = 0;
        for (int c = 0; c < RUN_COLUMNS; c++) {
            if (values[c] == NULL) {
                failed = 1;
            } else {
                PyList_SET_ITEM(columns[c], i, values[c]); /* (NULL rows: see below) */
            }
        }
        if (failed) {
            goto done; /* a list with NULL items is still freed correctly */
        }
    }
    result = PyTuple_Pack(RUN_COLUMNS, columns[0], columns[1], columns[2], columns[3],
                          columns[4], columns[5]);
done:
    for (int c = 0; c < RUN_COLUMNS; c++) {
        Py_XDECREF(columns[c]);
    }
    return result;
}

PyDoc_STRVAR(scan_run_doc,
             "scan_run(data, max_body_bytes, max_records)\n--\n\n"
             "The columns of the checked run (starts, sizes, topics, queue_ids, sys_flags,\n"
             "store_timestamp_positions), or None when a record fails a check (the\n"
             "reference, tide.format._record_run.scan_run_python, then says which).");

/* A run's records as the scan finds them, in a buffer that grows by doubling. */
typedef struct {
    RunRecord *recs;
    int64_t *starts;
    PyObject **topics; /* borrowed from `held` (one object per change of topic) */
    Py_ssize_t count, room;
} RunRows;

static int rows_add(RunRows *rows, int64_t at, const RunRecord *rec, PyObject *topic) {
    if (rows->count == rows->room) {
        /* Three arrays, one room: it grows only once all three have (the ones grown
         * before a failure are kept, larger than the room, and freed by the caller). */
        Py_ssize_t room = 0;
        RunRecord *recs = grow_full(rows->recs, rows->room, sizeof(RunRecord), 128, &room);
        if (recs == NULL) {
            return -1;
        }
        rows->recs = recs;
        int64_t *starts = grow_full(rows->starts, rows->room, sizeof(int64_t), 128, &room);
        if (starts == NULL) {
            return -1;
        }
        rows->starts = starts;
        PyObject **topics = grow_full(rows->topics, rows->room, sizeof(PyObject *), 128, &room);
        if (topics == NULL) {
            return -1;
        }
        rows->topics = topics;
        rows->room = room;
    }
    rows->recs[rows->count] = *rec;
    rows->starts[rows->count] = at;
    rows->topics[rows->count] = topic;
    rows->count++;
    return 0;
}

static PyObject *scan_run(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    long long max_body_bytes;
    Py_ssize_t max_records;
    if (!PyArg_ParseTuple(args, "y*Ln:scan_run", &view, &max_body_bytes, &max_records)) {
        return NULL;
    }
    const unsigned char *d = view.buf;
    RunRows rows = {NULL, NULL, NULL, 0, 0};
    PyObject *topic = NULL, *result = NULL;
    PyObject *held = PyList_New(0); /* the topics met, kept alive until the columns exist */
    int64_t at = 0;
    if (held == NULL) {
        goto done;
    }
    while (at < view.len) {
        RunRecord rec;
        if (!run_record(d, at, view.len, max_body_bytes, &rec) || rows.count >= max_records) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        Py_ssize_t topic_len = (Py_ssize_t)(rec.name_end - rec.topic_at);
        if (topic == NULL || PyBytes_GET_SIZE(topic) != topic_len ||
            memcmp(PyBytes_AS_STRING(topic), d + rec.topic_at, (size_t)topic_len) != 0) {
            topic = PyBytes_FromStringAndSize((const char *)d + rec.topic_at, topic_len);
            if (topic == NULL || PyList_Append(held, topic)) {
                Py_XDECREF(topic);
                goto done;
            }
            Py_DECREF(topic); /* held keeps it */
        }
        if (rows_add(&rows, at, &rec, topic)) {
            goto done;
        }
        at += rec.total;
    }
    result = run_columns(rows.recs, rows.starts, rows.count, rows.topics);
done:
    PyMem_Free(rows.recs);
    PyMem_Free(rows.starts);
    PyMem_Free(rows.topics);
    Py_XDECREF(held);
    PyBuffer_Release(&view);
    return result;
}

/* -- patch_run ---------------------------------------------------------------------- */

static inline void put_be64(unsigned char *p, int64_t value) {
    uint64_t v = (uint64_t)value;
    for (int i = 7; i >= 0; i--) {
        p[i] = (unsigned char)(v & 0xFF);
        v >>= 8;
    }
}

/* The queue offsets a run moves on, kept in C while the run is patched: a run's records
 * name a few queues many times (the store passes one key object per queue), so a record
 * costs a pointer comparison instead of two dict operations and an int object; the
 * table gets each queue's next offset when the run is done (or fails; or when a 33rd
 * queue needs a slot). */
#define PATCH_SLOTS 32

typedef struct {
    PyObject *key; /* borrowed from the run's keys */
    long long next;
} QueueSlot;

typedef struct {
    QueueSlot slots[PATCH_SLOTS];
    int count;
} QueueSlots;

/* The slot of key (the same object, else an equal key), or -1: not kept. */
static int find_slot(QueueSlots *s, PyObject *key, int *found) {
    for (int i = s->count - 1; i >= 0; i--) {
        if (s->slots[i].key == key) {
            *found = i;
            return 0;
        }
    }
    for (int i = 0; i < s->count; i++) {
        int equal = PyObject_RichCompareBool(s->slots[i].key, key, Py_EQ);
        if (equal < 0) {
            return -1;
        }
        if (equal) {
            *found = i;
            return 0;
        }
    }
    *found = -1;
    return 0;
}

/* Each slot's next offset into table, in the order the queues were met (the order the
 * reference inserts new keys); an error already set is kept. */
static int store_slots(QueueSlots *s, PyObject *table) {
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    int failed = 0;
    for (int i = 0; i < s->count && !failed; i++) {
        PyObject *next = PyLong_FromLongLong(s->slots[i].next);
        failed = next == NULL || PyDict_SetItem(table, s->slots[i].key, next);
        Py_XDECREF(next);
    }
    if (type != NULL) {
        PyErr_Restore(type, value, trace);
        return -1;
    }
    return failed ? -1 : 0;
}

/* The next queue offset of key (0 when table has none), moved on: a queue met for the
 * first time takes a slot, its offset read from table (full slots go to the table
 * first, so new queues enter it in the order met, as in the reference). */
static int next_slot_offset(QueueSlots *s, PyObject *table, PyObject *key,
                            long long *queue_offset) {
    int i;
    if (find_slot(s, key, &i)) {
        return -1;
    }
    if (i < 0) {
        if (s->count == PATCH_SLOTS) { /* full: to the table, and start again */
            if (store_slots(s, table)) {
                return -1;
            }
            s->count = 0;
        }
        PyObject *current = PyDict_GetItemWithError(table, key); /* borrowed */
        if (current == NULL && PyErr_Occurred()) {
            return -1;
        }
        long long first = current == NULL ? 0 : PyLong_AsLongLong(current);
        if (first == -1 && PyErr_Occurred()) {
            return -1;
        }
        i = s->count++;
        s->slots[i].key = key;
        s->slots[i].next = first;
    }
    *queue_offset = s->slots[i].next++;
    return 0;
}

static int patch_one(unsigned char *d, Py_ssize_t len, Py_ssize_t at, Py_ssize_t size,
                     Py_ssize_t ts_pos, long long queue_offset, long long physical,
                     long long now, const Py_buffer *host) {
    if (size <= 0 || at + size > len || ts_pos < POS_QUEUE_OFFSET + 16 ||
        ts_pos + 8 + host->len > size) {
        PyErr_Format(PyExc_ValueError,
                     "patch_run: record at %zd (size %zd, store timestamp at %zd, store host "
                     "%zd bytes) does not fit the %zd bytes of the run",
                     at, size, ts_pos, host->len, len);
        return -1;
    }
    put_be64(d + at + POS_QUEUE_OFFSET, queue_offset);
    put_be64(d + at + POS_QUEUE_OFFSET + 8, physical);
    put_be64(d + at + ts_pos, now);
    memcpy(d + at + ts_pos + 8, host->buf, (size_t)host->len);
    return 0;
}

static int patch_slots(Py_buffer *data, PyObject *sizes, PyObject *keys, PyObject *ts_positions,
                       PyObject *table, long long physical, long long now, Py_buffer *host,
                       PyObject *out_physical, PyObject *out_queue_offsets, QueueSlots *slots);

static int patch_rows(Py_buffer *data, PyObject *sizes, PyObject *keys, PyObject *ts_positions,
                      PyObject *table, long long physical, long long now, Py_buffer *host,
                      PyObject *out_physical, PyObject *out_queue_offsets) {
    QueueSlots slots;
    slots.count = 0;
    int failed = patch_slots(data, sizes, keys, ts_positions, table, physical, now, host,
                             out_physical, out_queue_offsets, &slots);
    /* (the keys stay alive: the caller holds the sequence) */
    return store_slots(&slots, table) || failed ? -1 : 0;
}

static int patch_slots(Py_buffer *data, PyObject *sizes, PyObject *keys, PyObject *ts_positions,
                       PyObject *table, long long physical, long long now, Py_buffer *host,
                       PyObject *out_physical, PyObject *out_queue_offsets, QueueSlots *slots) {
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sizes), at = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t size = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(sizes, i));
        Py_ssize_t ts_pos = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(ts_positions, i));
        if (PyErr_Occurred()) {
            return -1;
        }
        PyObject *key = PySequence_Fast_GET_ITEM(keys, i);
        long long queue_offset = 0; /* None: transaction prepared/rollback, no entry */
        if (key != Py_None && next_slot_offset(slots, table, key, &queue_offset)) {
            return -1;
        }
        if (patch_one(data->buf, data->len, at, size, ts_pos, queue_offset, physical + at, now,
                      host)) {
            return -1;
        }
        PyObject *p = PyLong_FromLongLong(physical + at);
        PyObject *q = PyLong_FromLongLong(queue_offset);
        if (p == NULL || q == NULL) {
            Py_XDECREF(p);
            Py_XDECREF(q);
            return -1;
        }
        PyList_SET_ITEM(out_physical, i, p);
        PyList_SET_ITEM(out_queue_offsets, i, q);
        at += size;
    }
    if (at != data->len) {
        PyErr_Format(PyExc_ValueError, "patch_run: the sizes add up to %zd, the run is %zd bytes",
                     at, data->len);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(patch_run_doc,
             "patch_run(data, sizes, queue_keys, store_timestamp_positions, table,\n"
             "          physical_offset, now_ms, store_host)\n--\n\n"
             "Patch each record of the run (one segment's worth) with its queue offset\n"
             "(from table, moved on), physical offset, store time and host; return\n"
             "(physical offsets, queue offsets). Reference: CommitLog._patch_python.");

static PyObject *patch_run(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data, host;
    PyObject *sizes_in, *keys_in, *ts_in, *table;
    long long physical, now;
    if (!PyArg_ParseTuple(args, "w*OOOO!LLy*:patch_run", &data, &sizes_in, &keys_in, &ts_in,
                          &PyDict_Type, &table, &physical, &now, &host)) {
        return NULL;
    }
    PyObject *result = NULL, *out_physical = NULL, *out_queue_offsets = NULL;
    PyObject *sizes = PySequence_Fast(sizes_in, "patch_run: sizes: a sequence");
    PyObject *keys = sizes ? PySequence_Fast(keys_in, "patch_run: queue_keys: a sequence") : NULL;
    PyObject *ts = keys ? PySequence_Fast(ts_in, "patch_run: positions: a sequence") : NULL;
    if (ts == NULL) {
        goto done;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sizes);
    if (PySequence_Fast_GET_SIZE(keys) != count || PySequence_Fast_GET_SIZE(ts) != count) {
        PyErr_SetString(PyExc_ValueError, "patch_run: columns of different lengths");
        goto done;
    }
    /* (items a failed record leaves NULL are fine: these lists never escape then) */
    out_physical = PyList_New(count);
    out_queue_offsets = PyList_New(count);
    if (out_physical == NULL || out_queue_offsets == NULL) {
        goto done;
    }
    if (patch_rows(&data, sizes, keys, ts, table, physical, now, &host, out_physical,
                   out_queue_offsets) == 0) {
        result = PyTuple_Pack(2, out_physical, out_queue_offsets);
    }
done:
    Py_XDECREF(out_physical);
    Py_XDECREF(out_queue_offsets);
    Py_XDECREF(sizes);
    Py_XDECREF(keys);
    Py_XDECREF(ts);
    PyBuffer_Release(&data);
    PyBuffer_Release(&host);
    return result;
}

/* -- replay_records ----------------------------------------------------------------- */

#define BLANK_MAGIC ((int32_t)0xCBD43194)
#define BLANK_MARKER_BYTES 8
#define PREFIX_BYTES 48
#define TX_MASK (3 << 2)
#define TX_PREPARED (1 << 2)
#define TX_ROLLBACK (3 << 2)

typedef struct {
    int64_t size, queue_offset, topic_at, topic_len;
    int32_t queue_id, sys_flag;
} AnyRecord;

/* Whether buf[pos:limit] starts with a record scan_record (tide/format/_record.py) calls
 * a RECORD, its topic's UTF-8 aside (checked by the caller). */
static int any_record(const unsigned char *b, int64_t pos, int64_t limit, int64_t expected,
                      int check_crc, int64_t max_body_bytes, AnyRecord *out) {
    int64_t avail = limit - pos;
    if (avail < BLANK_MARKER_BYTES) {
        return 0;
    }
    const unsigned char *r = b + pos;
    int64_t total = be32(r);
    int32_t magic = be32(r + POS_MAGIC);
    if ((magic != MESSAGE_MAGIC_V1 && magic != MESSAGE_MAGIC_V2) || total < FIXED_BYTES_V4 ||
        total > avail) {
        return 0; /* (zeros, a blank marker, or no record: scan_record says which) */
    }
    int32_t sys_flag = be32(r + POS_SYS_FLAG);
    int64_t born = (sys_flag & SYSFLAG_BORN_HOST_V6) ? 20 : 8;
    int64_t store = (sys_flag & SYSFLAG_STORE_HOST_V6) ? 20 : 8;
    int64_t tail = born + 8 + store + 4 + 8 + 4;
    if (PREFIX_BYTES + tail > total) {
        return 0;
    }
    int64_t body_len = be32(r + PREFIX_BYTES + tail - 4);
    int64_t body_at = PREFIX_BYTES + tail, topic_at;
    if (body_len < 0 || body_len > max_body_bytes || body_at + body_len > total) {
        return 0;
    }
    int64_t len_bytes = magic == MESSAGE_MAGIC_V1 ? 1 : 2;
    int64_t topic_len_at = body_at + body_len;
    if (topic_len_at + len_bytes > total) {
        return 0;
    }
    topic_at = topic_len_at + len_bytes;
    int64_t topic_len = len_bytes == 1 ? r[topic_len_at] : be16(r + topic_len_at);
    int64_t props_len_at = topic_at + topic_len;
    if (props_len_at + 2 > total || props_len_at + 2 + be16(r + props_len_at) != total ||
        be64(r + POS_PHYSICAL_OFFSET) != expected) {
        return 0;
    }
    if (check_crc && body_crc(r + body_at, (size_t)body_len) != beu32(r + POS_BODY_CRC)) {
        return 0;
    }
    out->size = total;
    out->queue_offset = be64(r + POS_QUEUE_OFFSET);
    out->topic_at = pos + topic_at;
    out->topic_len = topic_len;
    out->queue_id = be32(r + POS_QUEUE_ID);
    out->sys_flag = sys_flag;
    return 1;
}

/* next_offsets[(topic, queue_id)] = max(it, queue_offset + 1) */
static int replay_one(PyObject *table, PyObject *topic, const AnyRecord *rec) {
    PyObject *key = Py_BuildValue("(Oi)", topic, rec->queue_id);
    PyObject *next = key ? PyLong_FromLongLong(rec->queue_offset + 1) : NULL;
    int failed = -1;
    if (next != NULL) {
        PyObject *current = PyDict_GetItemWithError(table, key); /* borrowed */
        if (current == NULL && PyErr_Occurred()) {
            goto done;
        }
        int greater = current == NULL ? 1 : PyObject_RichCompareBool(next, current, Py_GT);
        if (greater < 0 || (greater && PyDict_SetItem(table, key, next))) {
            goto done;
        }
        failed = 0;
    }
done:
    Py_XDECREF(key);
    Py_XDECREF(next);
    return failed;
}

PyDoc_STRVAR(replay_records_doc,
             "replay_records(buf, pos, limit, base_offset, check_crc, max_body_bytes,\n"
             "               next_offsets)\n--\n\n"
             "Walk the records of buf[pos:limit] (buf[0] at commitlog offset base_offset)\n"
             "while scan_record calls them RECORD; replay each queue offset into\n"
             "next_offsets. Returns (the position of the first unit that is not a record,\n"
             "the records walked). Reference: tide.format._record.replay_records_python.");

static PyObject *replay_records(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t pos, limit;
    long long base_offset, max_body_bytes;
    int check_crc;
    PyObject *table;
    if (!PyArg_ParseTuple(args, "y*nnLpLO!:replay_records", &view, &pos, &limit, &base_offset,
                          &check_crc, &max_body_bytes, &PyDict_Type, &table)) {
        return NULL;
    }
    if (pos < 0 || limit > view.len) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError,
                            "replay_records: need 0 <= pos and limit <= len(buf), got pos %zd, "
                            "limit %zd, len %zd",
                            pos, limit, view.len);
    }
    PyObject *topic = NULL, *result = NULL;
    const unsigned char *topic_bytes = NULL;
    Py_ssize_t topic_len = 0, count = 0;
    AnyRecord rec;
    while (any_record(view.buf, pos, limit, base_offset + pos, check_crc, max_body_bytes, &rec)) {
        const unsigned char *at = (const unsigned char *)view.buf + rec.topic_at;
        PyObject *text = topic_of(at, rec.topic_len, &topic, &topic_bytes, &topic_len);
        if (text == NULL) {
            if (PyErr_Occurred()) {
                goto done;
            }
            break; /* not UTF-8: not a record */
        }
        int tx = rec.sys_flag & TX_MASK;
        int failed = (tx == TX_PREPARED || tx == TX_ROLLBACK) ? 0 : replay_one(table, text, &rec);
        Py_DECREF(text);
        if (failed) {
            goto done;
        }
        count++;
        pos += rec.size;
    }
    result = Py_BuildValue("(nn)", pos, count);
done:
    Py_XDECREF(topic);
    PyBuffer_Release(&view);
    return result;
}

/* -- encode_run_v4 ------------------------------------------------------------------ */

static inline void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* Item i of a sequence of bytes-like objects, as a buffer (released by the caller). */
static int item_buffer(PyObject *seq, Py_ssize_t i, Py_buffer *view) {
    return PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), view, PyBUF_SIMPLE);
}

/* The run's size, or -1 with an error set. */
static Py_ssize_t run_size(PyObject *bodies, PyObject *props, Py_ssize_t fixed) {
    Py_ssize_t total = 0, count = PySequence_Fast_GET_SIZE(bodies);
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_buffer body, prop;
        if (item_buffer(bodies, i, &body)) {
            return -1;
        }
        if (item_buffer(props, i, &prop)) {
            PyBuffer_Release(&body);
            return -1;
        }
        Py_ssize_t body_len = body.len, props_len = prop.len;
        PyBuffer_Release(&body);
        PyBuffer_Release(&prop);
        if (body_len > INT32_MAX - fixed - 65535 || props_len > 65535) {
            PyErr_Format(PyExc_ValueError,
                         "encode_run_v4: record %zd: body of %zd bytes or properties of %zd "
                         "bytes do not fit a record",
                         i, body_len, props_len);
            return -1;
        }
        total += fixed + body_len + props_len;
    }
    return total;
}

typedef struct {
    int32_t magic;
    const unsigned char *topic_part;
    Py_ssize_t topic_part_len;
    long long born_ms;
    const unsigned char *born_host;
} RunHeader;

/* One record at out: encode_record's IPv4 layout with the store's fields zero. */
static unsigned char *put_record(unsigned char *out, const RunHeader *h, int32_t queue_id,
                                 const Py_buffer *body, const Py_buffer *prop) {
    Py_ssize_t size = FIXED_BYTES_V4 - 1 + h->topic_part_len + body->len + prop->len;
    memset(out, 0, HEAD_V4_BYTES);
    put_be32(out, (uint32_t)size);
    put_be32(out + POS_MAGIC, (uint32_t)h->magic);
    put_be32(out + POS_BODY_CRC, body_crc(body->buf, (size_t)body->len));
    put_be32(out + POS_QUEUE_ID, (uint32_t)queue_id);
    put_be64(out + 40, h->born_ms); /* born_timestamp, after sys_flag */
    memcpy(out + 48, h->born_host, 8);
    put_be32(out + POS_BODY_LEN, (uint32_t)body->len);
    out += HEAD_V4_BYTES;
    memcpy(out, body->buf, (size_t)body->len);
    out += body->len;
    memcpy(out, h->topic_part, (size_t)h->topic_part_len);
    out += h->topic_part_len;
    out[0] = (unsigned char)(prop->len >> 8);
    out[1] = (unsigned char)prop->len;
    memcpy(out + 2, prop->buf, (size_t)prop->len);
    return out + 2 + prop->len;
}

static int put_records(unsigned char *out, const RunHeader *h, PyObject *ids, PyObject *bodies,
                       PyObject *props) {
    Py_ssize_t count = PySequence_Fast_GET_SIZE(bodies);
    for (Py_ssize_t i = 0; i < count; i++) {
        long queue_id = PyLong_AsLong(PySequence_Fast_GET_ITEM(ids, i));
        if (queue_id == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (queue_id < INT32_MIN || queue_id > INT32_MAX) {
            PyErr_Format(PyExc_OverflowError, "encode_run_v4: queue id %ld", queue_id);
            return -1;
        }
        Py_buffer body, prop;
        if (item_buffer(bodies, i, &body)) {
            return -1;
        }
        if (item_buffer(props, i, &prop)) {
            PyBuffer_Release(&body);
            return -1;
        }
        out = put_record(out, h, (int32_t)queue_id, &body, &prop);
        PyBuffer_Release(&body);
        PyBuffer_Release(&prop);
    }
    return 0;
}

PyDoc_STRVAR(encode_run_v4_doc,
             "encode_run_v4(magic, topic_part, queue_ids, bodies, properties, born_ms,\n"
             "              born_host)\n--\n\n"
             "The records of one topic and born time (flag and sys_flag 0, an 8-byte born\n"
             "host, the store's fields zero) as one bytes object. Reference:\n"
             "tide.format._record_run.RunWriter.add_many_python.");

static PyObject *encode_run_v4(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer topic_part, born_host;
    PyObject *ids_in, *bodies_in, *props_in;
    RunHeader h;
    if (!PyArg_ParseTuple(args, "iy*OOOLy*:encode_run_v4", &h.magic, &topic_part, &ids_in,
                          &bodies_in, &props_in, &h.born_ms, &born_host)) {
        return NULL;
    }
    PyObject *result = NULL, *ids = NULL, *bodies = NULL, *props = NULL;
    if (born_host.len != 8) {
        PyErr_SetString(PyExc_ValueError, "encode_run_v4: the born host must be 8 bytes (IPv4)");
        goto done;
    }
    h.topic_part = topic_part.buf;
    h.topic_part_len = topic_part.len;
    h.born_host = born_host.buf;
    ids = PySequence_Fast(ids_in, "encode_run_v4: queue_ids: a sequence");
    bodies = ids ? PySequence_Fast(bodies_in, "encode_run_v4: bodies: a sequence") : NULL;
    props = bodies ? PySequence_Fast(props_in, "encode_run_v4: properties: a sequence") : NULL;
    if (props == NULL) {
        goto done;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(bodies);
    if (PySequence_Fast_GET_SIZE(ids) != count || PySequence_Fast_GET_SIZE(props) != count) {
        PyErr_SetString(PyExc_ValueError, "encode_run_v4: columns of different lengths");
        goto done;
    }
    Py_ssize_t size = run_size(bodies, props, FIXED_BYTES_V4 - 1 + topic_part.len);
    if (size < 0 || (result = PyBytes_FromStringAndSize(NULL, size)) == NULL) {
        goto done;
    }
    if (put_records((unsigned char *)PyBytes_AS_STRING(result), &h, ids, bodies, props)) {
        Py_CLEAR(result);
    }
done:
    Py_XDECREF(ids);
    Py_XDECREF(bodies);
    Py_XDECREF(props);
    PyBuffer_Release(&topic_part);
    PyBuffer_Release(&born_host);
    return result;
}

/* -- index_key_hashes_ascii --------------------------------------------------------- */

/* IndexFile.indexKeyHashMethod of prefix + key: abs(Java hashCode), 0 for MIN_VALUE.
 * ASCII bytes are their own UTF-16 code units. */
static long index_hash(uint32_t h) {
    int32_t signed_h = (int32_t)h;
    if (signed_h == INT32_MIN) {
        return 0;
    }
    return signed_h < 0 ? -(long)signed_h : (long)signed_h;
}

static int is_ascii(const unsigned char *p, Py_ssize_t len) {
    Py_ssize_t i = 0;
    uint64_t high = 0;
    for (; i + 8 <= len; i += 8) { /* eight bytes a test (memcpy: any alignment) */
        uint64_t word;
        memcpy(&word, p + i, 8);
        high |= word;
    }
    for (; i < len; i++) {
        high |= p[i];
    }
    return (high & UINT64_C(0x8080808080808080)) == 0;
}

/* Horner's rule of Java's hashCode (h = 31 * h + unit, mod 2^32) over ASCII bytes, their
 * own UTF-16 units, from h. Eight bytes a step: h * 31^8 plus each byte times its power
 * of 31, the same sum; the eight products do not wait for each other, so a step waits
 * on one multiply-add of the step before where a byte at a time waits on each (the
 * dispatch hashes a 32-character UNIQ_KEY a message: 25-28 ns a key against 64-73). */
static uint32_t horner31(uint32_t h, const unsigned char *k, Py_ssize_t len) {
    const uint32_t p2 = 31u * 31u, p3 = p2 * 31u, p4 = p3 * 31u;
    const uint32_t p5 = p4 * 31u, p6 = p5 * 31u, p7 = p6 * 31u, p8 = p7 * 31u;
    Py_ssize_t j = 0;
    for (; j + 8 <= len; j += 8) {
        const unsigned char *b = k + j;
        h = h * p8 + ((uint32_t)b[0] * p7 + (uint32_t)b[1] * p6) +
            ((uint32_t)b[2] * p5 + (uint32_t)b[3] * p4) +
            ((uint32_t)b[4] * p3 + (uint32_t)b[5] * p2) + ((uint32_t)b[6] * 31u + b[7]);
    }
    for (; j < len; j++) {
        h = h * 31u + k[j];
    }
    return h;
}

PyDoc_STRVAR(index_key_hashes_ascii_doc,
             "index_key_hashes_ascii(keys, prefix)\n--\n\n"
             "tide.format.index_key_hashes(keys, prefix) when the prefix and every key are\n"
             "ASCII, as an array('q'); None when one is not (the reference then hashes them).");

static PyObject *index_key_hashes_ascii(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *keys_in;
    Py_buffer prefix;
    if (!PyArg_ParseTuple(args, "Oy*:index_key_hashes_ascii", &keys_in, &prefix)) {
        return NULL;
    }
    long long *hashes = NULL;
    PyObject *result = NULL, *keys = PySequence_Fast(keys_in, "keys: a sequence");
    if (keys == NULL) {
        goto done;
    }
    const unsigned char *pre = prefix.buf;
    if (!is_ascii(pre, prefix.len)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    uint32_t start = horner31(0, pre, prefix.len);
    Py_ssize_t count = PySequence_Fast_GET_SIZE(keys);
    if ((hashes = PyMem_Malloc(sizeof(long long) * (size_t)(count + 1))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(keys, i);
        if (!PyBytes_Check(key)) {
            PyErr_Format(PyExc_TypeError, "index_key_hashes_ascii: key %zd is not bytes", i);
            goto done;
        }
        const unsigned char *k = (const unsigned char *)PyBytes_AS_STRING(key);
        Py_ssize_t len = PyBytes_GET_SIZE(key);
        if (!is_ascii(k, len)) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        hashes[i] = index_hash(horner31(start, k, len));
    }
    result = int64_array(hashes, count);
done:
    PyMem_Free(hashes);
    Py_XDECREF(keys);
    PyBuffer_Release(&prefix);
    return result;
}

/* -- span_records, record_tags: the pull's span check and tag filter --------------- */

PyDoc_STRVAR(span_records_doc,
             "span_records(piece, offset, at_most)\n--\n\n"
             "How many message records (either magic) fill piece, stored at commitlog\n"
             "offset, exactly, each at its PHYSICALOFFSET; -1 when its bytes are not whole\n"
             "records or hold more than at_most.\n"
             "The reference: tide.format._record_spans.span_records_python.");

static PyObject *span_records(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    long long offset;
    Py_ssize_t at_most;
    if (!PyArg_ParseTuple(args, "y*Ln:span_records", &view, &offset, &at_most)) {
        return NULL;
    }
    const unsigned char *d = view.buf;
    Py_ssize_t pos = 0, end = view.len, found = 0;
    while (pos < end) {
        if (end - pos < FIXED_BYTES_V4 || found == at_most) {
            found = -1;
            break;
        }
        int32_t total = be32(d + pos), magic = be32(d + pos + POS_MAGIC);
        if ((magic != MESSAGE_MAGIC_V1 && magic != (int32_t)0xDAA320AB) ||
            total < FIXED_BYTES_V4 || total > end - pos ||
            be64(d + pos + POS_PHYSICAL_OFFSET) != (int64_t)offset + pos) {
            found = -1;
            break;
        }
        pos += total;
        found++;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(found);
}

/* Where the TAGS value of the properties p[0:len] is (the last item named TAGS, as
 * decode_properties keeps the last); *value is NULL when there is none. */
static void tags_value(const char *p, Py_ssize_t len, const char **value, Py_ssize_t *value_len) {
    const char *found[NAMES];
    Py_ssize_t found_len[NAMES];
    find_values(p, len, found, found_len);
    *value = found[TAGS];
    *value_len = found_len[TAGS];
}

/* The properties bounds of the V1-magic IPv4 record d[pos:pos+size], or -1 when it is
 * not one or its lengths do not add up to size (the reference then reads it). */
static int v4_properties(const unsigned char *d, Py_ssize_t pos, Py_ssize_t size,
                         Py_ssize_t *props_at, Py_ssize_t *props_len) {
    if (be32(d + pos + POS_MAGIC) != MESSAGE_MAGIC_V1 ||
        be32(d + pos + POS_SYS_FLAG) & SYSFLAG_HOSTS_V6) {
        return -1;
    }
    int64_t body_len = be32(d + pos + POS_BODY_LEN);
    int64_t topic_len_at = HEAD_V4_BYTES + body_len;
    if (body_len < 0 || topic_len_at + 3 > size) {
        return -1;
    }
    int64_t props_len_at = topic_len_at + 1 + d[pos + topic_len_at];
    if (props_len_at + 2 > size || props_len_at + 2 + be16(d + pos + props_len_at) != size) {
        return -1;
    }
    *props_at = pos + (Py_ssize_t)props_len_at + 2;
    *props_len = size - (Py_ssize_t)props_len_at - 2;
    return 0;
}

/* Record i's TAGS as str into tags[i] (the previous record's object when equal). */
static int put_tags(PyObject *tags, Py_ssize_t i, const char *p, Py_ssize_t len,
                    LastValue *last) {
    const char *value;
    Py_ssize_t value_len;
    tags_value(p, len, &value, &value_len);
    if (value == NULL) {
        value = "";
        value_len = 0;
    }
    PyObject *text;
    if (last->object != NULL && last->len == value_len &&
        memcmp(last->bytes, value, (size_t)value_len) == 0) {
        text = Py_NewRef(last->object);
    } else {
        text = PyUnicode_DecodeUTF8(value, value_len, "replace");
        if (text == NULL) {
            return -1;
        }
        Py_XSETREF(last->object, Py_NewRef(text));
        last->bytes = value;
        last->len = value_len;
    }
    return PyList_SetItem(tags, i, text); /* (drops the placeholder) */
}

/* The sizes and TAGS of the count records of d[0:len]; 1 when a record is not one this
 * path reads (the reference then does), -1 on a Python error. */
static int tags_rows(const unsigned char *d, Py_ssize_t len, Py_ssize_t count, PyObject *sizes,
                     PyObject *tags) {
    LastValue last = {NULL, NULL, 0};
    int outcome = 1;
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t props_at, props_len;
        if (len - pos < FIXED_BYTES_V4) {
            goto done;
        }
        int32_t size = be32(d + pos);
        if (size < FIXED_BYTES_V4 || size > len - pos ||
            v4_properties(d, pos, size, &props_at, &props_len)) {
            goto done;
        }
        PyObject *size_object = PyLong_FromLong(size);
        if (size_object == NULL) {
            outcome = -1;
            goto done;
        }
        if (PyList_SetItem(sizes, i, size_object) ||
            put_tags(tags, i, (const char *)d + props_at, props_len, &last)) {
            outcome = -1;
            goto done;
        }
        pos += size;
    }
    outcome = pos == len ? 0 : 1;
done:
    Py_XDECREF(last.object);
    return outcome;
}

PyDoc_STRVAR(record_tags_doc,
             "record_tags(records, count)\n--\n\n"
             "(sizes, tags) of the count records back to back in records: each one's\n"
             "TOTALSIZE and TAGS ('' when absent); None when a record is not a V1-magic\n"
             "IPv4 one whose lengths add up, or the records do not end with the bytes\n"
             "(the reference then reads them and says what is wrong).\n"
             "The reference: tide.format._record_spans.record_tags_python.");

static PyObject *record_tags(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*n:record_tags", &view, &count)) {
        return NULL;
    }
    PyObject *result = NULL, *sizes = NULL, *tags = NULL;
    if (count < 0) {
        PyErr_Format(PyExc_ValueError, "record_tags: count %zd is negative", count);
        goto done;
    }
    sizes = PyList_New(count);
    tags = sizes ? PyList_New(count) : NULL;
    if (tags == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) { /* (a list must be whole if we stop) */
        PyList_SET_ITEM(sizes, i, Py_NewRef(Py_None));
        PyList_SET_ITEM(tags, i, Py_NewRef(Py_None));
    }
    int outcome = tags_rows(view.buf, view.len, count, sizes, tags);
    if (outcome == 0) {
        result = PyTuple_Pack(2, sizes, tags);
    } else if (outcome == 1) {
        result = Py_NewRef(Py_None);
    }
done:
    Py_XDECREF(sizes);
    Py_XDECREF(tags);
    PyBuffer_Release(&view);
    return result;
}

/* -- v4_record_fields: the one reader of whole records (the client's decoding of pulled
 * records, the storage's StoredMessage reads) ----------------------------------------- */

#define FIELD_COLUMNS 16 /* with the stored fields; 12 without (the client's) */
#define MESSAGE_COLUMNS 12
enum {
    F_SIZE, F_QUEUE_ID, F_QUEUE_OFFSET, F_PHYSICAL_OFFSET, F_BORN_TS, F_STORE_TS,
    F_BORN_HOST, F_STORE_HOST, F_RECONSUME, F_BODY, F_TOPIC, F_PROPERTIES,
    F_FLAG, F_SYS_FLAG, F_PREPARED, F_BODY_CRC
};
#define POS_FLAG 16
#define POS_BORN_TIMESTAMP 40
#define POS_BORN_HOST 48
#define POS_STORE_HOST 64
#define POS_RECONSUME 72
#define POS_PREPARED 76

/* The bounds of the V1-magic IPv4 record d[pos:pos+size] whose body CRC and physical
 * offset check, or -1 (the reference decoder then says what is wrong). */
static int v4_fields_at(const unsigned char *d, Py_ssize_t pos, Py_ssize_t size,
                        Py_ssize_t *topic_at, Py_ssize_t *props_at) {
    Py_ssize_t props_start, props_len;
    if (v4_properties(d, pos, size, &props_start, &props_len)) {
        return -1;
    }
    int64_t body_len = be32(d + pos + POS_BODY_LEN);
    const unsigned char *body = d + pos + HEAD_V4_BYTES;
    if (body_crc(body, (size_t)body_len) != beu32(d + pos + POS_BODY_CRC) ||
        be64(d + pos + POS_PHYSICAL_OFFSET) < 0) {
        return -1;
    }
    *topic_at = pos + HEAD_V4_BYTES + (Py_ssize_t)body_len;
    *props_at = props_start;
    return 0;
}

/* A bytes object of p[0:len], the previous one of its column when equal (hosts, topics). */
static PyObject *same_bytes(const unsigned char *p, Py_ssize_t len, LastValue *last) {
    return value_of((const char *)p, len, last);
}

/* The properties p[0:len] as a dict, as decode_properties gives them: items split at
 * \x02 (empty ones skipped), each at its first \x01 (one without it skipped), the last
 * of a name kept. Only for ASCII bytes (their text is their bytes); anything else goes
 * to decode_properties itself (the module's reference, passed in). */
static PyObject *properties_dict(const char *p, Py_ssize_t len, PyObject *reference) {
    for (Py_ssize_t i = 0; i < len; i++) {
        if ((unsigned char)p[i] & 0x80) {
            return PyObject_CallFunction(reference, "y#", p, len);
        }
    }
    PyObject *result = PyDict_New();
    const char *end = p + len;
    while (result != NULL && p < end) {
        const char *item_end = memchr(p, '\x02', (size_t)(end - p));
        if (item_end == NULL) {
            item_end = end;
        }
        const char *sep = memchr(p, '\x01', (size_t)(item_end - p));
        if (sep != NULL) {
            PyObject *name = PyUnicode_DecodeASCII(p, sep - p, NULL);
            PyObject *value = name ? PyUnicode_DecodeASCII(sep + 1, item_end - sep - 1, NULL)
                                   : NULL;
            if (value == NULL || PyDict_SetItem(result, name, value)) {
                Py_CLEAR(result);
            }
            Py_XDECREF(name);
            Py_XDECREF(value);
        }
        p = item_end + 1;
    }
    return result;
}

static int put_field(PyObject *column, Py_ssize_t i, PyObject *value) {
    return value == NULL ? -1 : PyList_SetItem(column, i, value);
}

/* Record i's fields into the columns. */
static int field_row(const unsigned char *d, Py_ssize_t pos, Py_ssize_t size, Py_ssize_t topic_at,
                     Py_ssize_t props_at, Py_ssize_t i, PyObject *c[FIELD_COLUMNS],
                     LastValue last[3], PyObject *reference) {
    const unsigned char *r = d + pos;
    Py_ssize_t body_at = pos + HEAD_V4_BYTES;
    return put_field(c[F_SIZE], i, PyLong_FromSsize_t(size)) ||
           put_field(c[F_QUEUE_ID], i, PyLong_FromLong(be32(r + POS_QUEUE_ID))) ||
           put_field(c[F_QUEUE_OFFSET], i, PyLong_FromLongLong(be64(r + POS_QUEUE_OFFSET))) ||
           put_field(c[F_PHYSICAL_OFFSET], i,
                     PyLong_FromLongLong(be64(r + POS_PHYSICAL_OFFSET))) ||
           put_field(c[F_BORN_TS], i, PyLong_FromLongLong(be64(r + POS_BORN_TIMESTAMP))) ||
           put_field(c[F_STORE_TS], i, PyLong_FromLongLong(be64(r + POS_STORE_TIMESTAMP))) ||
           put_field(c[F_BORN_HOST], i, same_bytes(r + POS_BORN_HOST, 8, &last[0])) ||
           put_field(c[F_STORE_HOST], i, same_bytes(r + POS_STORE_HOST, 8, &last[1])) ||
           put_field(c[F_RECONSUME], i, PyLong_FromLong(be32(r + POS_RECONSUME))) ||
           put_field(c[F_BODY], i,
                     PyBytes_FromStringAndSize((const char *)d + body_at, topic_at - body_at)) ||
           put_field(c[F_TOPIC], i,
                     same_bytes(d + topic_at + 1, props_at - 2 - topic_at - 1, &last[2])) ||
           put_field(c[F_PROPERTIES], i,
                     properties_dict((const char *)d + props_at, pos + size - props_at,
                                     reference)) ||
           (c[F_FLAG] != NULL &&
            (put_field(c[F_FLAG], i, PyLong_FromLong(be32(r + POS_FLAG))) ||
             put_field(c[F_SYS_FLAG], i, PyLong_FromLong(be32(r + POS_SYS_FLAG))) ||
             put_field(c[F_PREPARED], i, PyLong_FromLongLong(be64(r + POS_PREPARED))) ||
             put_field(c[F_BODY_CRC], i, PyLong_FromUnsignedLong(beu32(r + POS_BODY_CRC)))));
}

/* 0 when the count records fill d[0:len] and each is read into the columns; 1 when one
 * is not a record this path reads; -1 on a Python error. */
static int field_rows(const unsigned char *d, Py_ssize_t len, Py_ssize_t count,
                      PyObject *columns[FIELD_COLUMNS], PyObject *reference) {
    LastValue last[3] = {{NULL, NULL, 0}, {NULL, NULL, 0}, {NULL, NULL, 0}};
    int outcome = 1;
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t topic_at, props_at;
        if (len - pos < FIXED_BYTES_V4) {
            goto done;
        }
        int32_t size = be32(d + pos);
        if (size < FIXED_BYTES_V4 || size > len - pos ||
            v4_fields_at(d, pos, size, &topic_at, &props_at)) {
            goto done;
        }
        if (field_row(d, pos, size, topic_at, props_at, i, columns, last, reference)) {
            outcome = -1;
            goto done;
        }
        pos += size;
    }
    outcome = pos == len ? 0 : 1;
done:
    for (int n = 0; n < 3; n++) {
        Py_XDECREF(last[n].object);
    }
    return outcome;
}

PyDoc_STRVAR(v4_record_fields_doc,
             "v4_record_fields(records, count, decode_properties, stored=False)\n--\n\n"
             "The fields of the count records back to back in records, as 12 columns:\n"
             "sizes, queue ids, queue offsets, physical offsets, born and store times,\n"
             "born and store hosts (packed), reconsume times, bodies, topics (bytes),\n"
             "properties (dicts: ASCII ones read here, others by decode_properties);\n"
             "with stored, 16: then flags, sys flags, prepared transaction offsets and\n"
             "body CRCs. "
             "None unless each is a V1-magic IPv4 record whose lengths\n"
             "add up, body CRC checks and physical offset is not negative, and they fill\n"
             "the bytes (the reference decoder then says what is wrong).\n"
             "The reference: tide.format._record_spans.v4_record_fields_python.");

static PyObject *v4_record_fields(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t count;
    PyObject *reference;
    int stored = 0;
    if (!PyArg_ParseTuple(args, "y*nO|p:v4_record_fields", &view, &count, &reference, &stored)) {
        return NULL;
    }
    PyObject *result = NULL, *columns[FIELD_COLUMNS] = {NULL};
    int column_count = stored ? FIELD_COLUMNS : MESSAGE_COLUMNS; /* (the others stay NULL) */
    if (count < 0) {
        PyErr_Format(PyExc_ValueError, "v4_record_fields: count %zd is negative", count);
        goto done;
    }
    for (int n = 0; n < column_count; n++) {
        if ((columns[n] = PyList_New(count)) == NULL) {
            goto done;
        }
        for (Py_ssize_t i = 0; i < count; i++) { /* (a list must be whole if we stop) */
            PyList_SET_ITEM(columns[n], i, Py_NewRef(Py_None));
        }
    }
    int outcome = field_rows(view.buf, view.len, count, columns, reference);
    if (outcome == 0) {
        result = PyTuple_New(column_count);
        for (int n = 0; result != NULL && n < column_count; n++) {
            PyTuple_SET_ITEM(result, n, Py_NewRef(columns[n]));
        }
    } else if (outcome == 1) {
        result = Py_NewRef(Py_None);
    }
done:
    for (int n = 0; n < FIELD_COLUMNS; n++) {
        Py_XDECREF(columns[n]);
    }
    PyBuffer_Release(&view);
    return result;
}

/* -- put_index_keys: the dispatch's batch put into an index file --------------------- */

/* The index file layout: docs/formats.md, "Index file" (tide/format/_index_file.py):
 * a 40-byte header (begin/end timestamp i64, begin/end physical offset i64, hash slot
 * count i32, index count i32), slot_count 4-byte slots, max_entries 20-byte entries
 * (key hash i32, physical offset i64, time diff in seconds i32, previous entry i32). */
#define INDEX_HEADER_BYTES 40
#define INDEX_SLOT_BYTES 4
#define INDEX_ENTRY_BYTES 20
#define INDEX_POS_BEGIN_TIMESTAMP 0
#define INDEX_POS_END_TIMESTAMP 8
#define INDEX_POS_BEGIN_PHY_OFFSET 16
#define INDEX_POS_END_PHY_OFFSET 24
#define INDEX_POS_HASH_SLOT_COUNT 32
#define INDEX_POS_INDEX_COUNT 36
#define INDEX_ENTRY_POS_PREV 16

/* time_diff_seconds: Java's truncating division of the difference, clamped to
 * [0, INT32_MAX]; 0 when there is no begin time. (Unsigned: no overflow.) */
static inline uint32_t index_time_diff(int64_t stamp, int64_t begin) {
    if (begin <= 0 || stamp <= begin) {
        return 0;
    }
    uint64_t diff = ((uint64_t)stamp - (uint64_t)begin) / 1000u;
    return diff > INT32_MAX ? (uint32_t)INT32_MAX : (uint32_t)diff;
}

/* The newest entry of each slot the batch has used so far: open addressing, twice the
 * batch's size (a power of two), EMPTY_SLOT marking a free place. */
#define EMPTY_SLOT UINT32_MAX
typedef struct {
    uint32_t *slots;
    int32_t *numbers;
    size_t mask;
} SlotMap;

static int slot_map_init(SlotMap *m, Py_ssize_t count) {
    size_t capacity = 16;
    while (capacity < (size_t)count * 2) {
        capacity *= 2;
    }
    m->mask = capacity - 1;
    m->slots = PyMem_Malloc(capacity * sizeof(uint32_t));
    m->numbers = PyMem_Malloc(capacity * sizeof(int32_t));
    if (m->slots == NULL || m->numbers == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(m->slots, 0xFF, capacity * sizeof(uint32_t));
    return 0;
}

/* The place of slot in the map: where it is, or the free place it would take. */
static inline size_t slot_map_find(const SlotMap *m, uint32_t slot) {
    size_t at = ((size_t)slot * 0x9E3779B1u) & m->mask;
    while (m->slots[at] != EMPTY_SLOT && m->slots[at] != slot) {
        at = (at + 1) & m->mask;
    }
    return at;
}

/* The batch's key hashes (checked to be in [0, 2^31)), offsets and timestamps, the first
 * count of each, into h, o and t. */
static int index_columns(const long long *hashes, const long long *offsets,
                         const long long *stamps, Py_ssize_t count, uint32_t *h, int64_t *o,
                         int64_t *t) {
    for (Py_ssize_t i = 0; i < count; i++) {
        long long hash = hashes[i];
        if (hash < 0 || hash > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "put_index_keys: key hash %lld at %zd is not in "
                         "[0, 2^31)", hash, i);
            return -1;
        }
        h[i] = (uint32_t)hash;
        o[i] = offsets[i];
        t[i] = stamps[i];
    }
    return 0;
}

typedef struct {
    unsigned char *file;     /* the whole index file */
    Py_ssize_t entries_at;   /* where entry 0 is */
    uint32_t slot_count;
    int32_t first;           /* the number the batch's first entry gets */
    int64_t begin_timestamp; /* the header's */
} IndexTarget;

/* At the default geometry (RocketMQ's 5 million slots, 20 MB) each key's slot is a
 * cache miss (and mostly a TLB miss), ~100-200 ns waited for one after the other. The batch's
 * slots are known up front, so the loop asks for the slot this many keys ahead while
 * it works on this one: the misses overlap. */
#define INDEX_PREFETCH_AHEAD 16

/* Each key's entry into out (count x 20 bytes) as one put_key after another would write
 * it; the batch's slots (in order) into slots_out; returns how many slots go from empty
 * to used (put_key's rule: a slot naming the entry being written is a torn put, whose
 * entry still links the older chain; a value that is no older entry is "empty"). */
static int64_t index_entries(const IndexTarget *x, SlotMap *m, Py_ssize_t count, const uint32_t *h,
                             const int64_t *o, const int64_t *t, unsigned char *out,
                             uint32_t *slots_out) {
    int64_t fresh = 0;
    int64_t begin = x->begin_timestamp, last_stamp = 0;
    uint32_t last_diff = 0;
    const unsigned char *table = x->file + INDEX_HEADER_BYTES;
    for (Py_ssize_t i = 0; i < count; i++) {
        slots_out[i] = h[i] % x->slot_count;
    }
    for (Py_ssize_t i = 0; i < count && i < INDEX_PREFETCH_AHEAD; i++) {
        __builtin_prefetch(table + (size_t)slots_out[i] * INDEX_SLOT_BYTES);
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t number = x->first + (int32_t)i;
        uint32_t slot = slots_out[i];
        if (i + INDEX_PREFETCH_AHEAD < count) {
            __builtin_prefetch(table + (size_t)slots_out[i + INDEX_PREFETCH_AHEAD] *
                                           INDEX_SLOT_BYTES);
        }
        size_t at = slot_map_find(m, slot);
        int32_t prev;
        if (m->slots[at] == slot) {
            prev = m->numbers[at];
        } else {
            prev = be32(table + (size_t)slot * INDEX_SLOT_BYTES);
            if (prev == number) {
                const unsigned char *torn =
                    x->file + x->entries_at + (Py_ssize_t)number * INDEX_ENTRY_BYTES;
                prev = be32(torn + INDEX_ENTRY_POS_PREV);
                if (!(prev > 0 && prev < number)) {
                    prev = 0;
                }
            } else if (prev <= 0 || prev > number) {
                prev = 0;
            }
            m->slots[at] = slot;
        }
        m->numbers[at] = number;
        fresh += prev == 0;
        if (i <= 1 || t[i] != last_stamp) { /* (a time per run of equal stamps) */
            last_stamp = t[i];
            last_diff = index_time_diff(t[i], begin);
        }
        if (i == 0 && x->first <= 1) {
            begin = t[0]; /* the very first entry of a file sets the later ones' begin */
        }
        unsigned char *e = out + i * INDEX_ENTRY_BYTES;
        put_be32(e, h[i]);
        put_be64(e + 4, o[i]);
        put_be32(e + 12, last_diff);
        put_be32(e + 16, (uint32_t)prev);
    }
    return fresh;
}

static int index_write_entries(unsigned char *file, int fd, const unsigned char *entries,
                               Py_ssize_t len, Py_ssize_t start) {
    if (fd < 0) {
        memcpy(file + start, entries, (size_t)len);
        return 0;
    }
    Py_ssize_t written;
    Py_BEGIN_ALLOW_THREADS written = pwrite(fd, entries, (size_t)len, (off_t)start);
    Py_END_ALLOW_THREADS if (written < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (written != len) {
        PyErr_Format(PyExc_OSError, "short write of %zd index entry bytes at %zd", len, start);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(put_index_keys_doc,
             "put_index_keys(buf, slot_count, max_entries, key_hashes, phy_offsets,\n"
             "               store_timestamps_ms, fd)\n--\n\n"
             "tide.format.put_key_batch: the keys into the index file buf (one put_key\n"
             "after another, same bytes); how many were put. fd >= 0: the entries are\n"
             "written with pwrite on it. The reference: tide.format._index_put.\n"
             "put_key_batch_python.");

static PyObject *put_index_keys(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t slot_count, max_entries;
    PyObject *hashes_in, *offsets_in, *stamps_in;
    int fd;
    if (!PyArg_ParseTuple(args, "w*nnOOOi:put_index_keys", &view, &slot_count, &max_entries,
                          &hashes_in, &offsets_in, &stamps_in, &fd)) {
        return NULL;
    }
    PyObject *result = NULL;
    long long *hashes = NULL, *offsets = NULL, *stamps = NULL;
    uint32_t *h = NULL, *slots = NULL;
    int64_t *o = NULL, *t = NULL;
    unsigned char *entries = NULL;
    SlotMap m = {NULL, NULL, 0};
    if (slot_count <= 0 || slot_count > INT32_MAX || max_entries <= 1 ||
        max_entries > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "put_index_keys: slot count %zd, max entries %zd",
                     slot_count, max_entries);
        goto done;
    }
    long long file_bytes = INDEX_HEADER_BYTES + (long long)slot_count * INDEX_SLOT_BYTES +
                           (long long)max_entries * INDEX_ENTRY_BYTES;
    if (view.len < file_bytes) {
        PyErr_Format(PyExc_ValueError, "index buffer of %zd bytes, geometry needs %lld", view.len,
                     file_bytes);
        goto done;
    }
    Py_ssize_t given = 0, n_offsets = 0, n_stamps = 0;
    if ((hashes = int64_values(hashes_in, &given, "key_hashes: a sequence")) == NULL ||
        (offsets = int64_values(offsets_in, &n_offsets, "phy_offsets: a sequence")) == NULL ||
        (stamps = int64_values(stamps_in, &n_stamps, "store_timestamps_ms: a sequence")) ==
            NULL) {
        goto done;
    }
    if (n_offsets != given || n_stamps != given) {
        PyErr_SetString(PyExc_ValueError, "put_index_keys: the three columns differ in length");
        goto done;
    }
    unsigned char *file = view.buf;
    int32_t first = be32(file + INDEX_POS_INDEX_COUNT);
    first = first > 0 ? first : 1; /* IndexHeader.load: a fresh file counts from 1 */
    Py_ssize_t count = given < max_entries - first ? given : max_entries - first;
    if (count <= 0) {
        result = PyLong_FromLong(0);
        goto done;
    }
    h = PyMem_Malloc((size_t)count * sizeof(uint32_t));
    slots = PyMem_Malloc((size_t)count * sizeof(uint32_t));
    o = PyMem_Malloc((size_t)count * sizeof(int64_t));
    t = PyMem_Malloc((size_t)count * sizeof(int64_t));
    entries = PyMem_Malloc((size_t)count * INDEX_ENTRY_BYTES);
    if (h == NULL || slots == NULL || o == NULL || t == NULL || entries == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (index_columns(hashes, offsets, stamps, count, h, o, t) < 0 ||
        slot_map_init(&m, count) < 0) {
        goto done;
    }
    IndexTarget x = {file, INDEX_HEADER_BYTES + slot_count * INDEX_SLOT_BYTES,
                     (uint32_t)slot_count, first, be64(file + INDEX_POS_BEGIN_TIMESTAMP)};
    int64_t slots_used = be32(file + INDEX_POS_HASH_SLOT_COUNT) +
                         index_entries(&x, &m, count, h, o, t, entries, slots);
    if (slots_used > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "put_index_keys: hash slot count past 2^31 - 1");
        goto done;
    }
    /* entries, slots, header: put_key's order (a crash in between leaves slots naming
     * entries the header does not count, which put_key takes as torn puts) */
    Py_ssize_t start = x.entries_at + (Py_ssize_t)first * INDEX_ENTRY_BYTES;
    if (index_write_entries(file, fd, entries, count * INDEX_ENTRY_BYTES, start) < 0) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) { /* (in order: the last key of a slot names it) */
        put_be32(file + INDEX_HEADER_BYTES + (size_t)slots[i] * INDEX_SLOT_BYTES,
                 (uint32_t)(first + (int32_t)i));
    }
    if (first <= 1) {
        put_be64(file + INDEX_POS_BEGIN_TIMESTAMP, t[0]);
        put_be64(file + INDEX_POS_BEGIN_PHY_OFFSET, o[0]);
    }
    put_be64(file + INDEX_POS_END_TIMESTAMP, t[count - 1]);
    put_be64(file + INDEX_POS_END_PHY_OFFSET, o[count - 1]);
    put_be32(file + INDEX_POS_HASH_SLOT_COUNT, (uint32_t)slots_used);
    put_be32(file + INDEX_POS_INDEX_COUNT, (uint32_t)(first + (int32_t)count));
    result = PyLong_FromSsize_t(count);
done:
    PyMem_Free(m.slots);
    PyMem_Free(m.numbers);
    PyMem_Free(h);
    PyMem_Free(slots);
    PyMem_Free(o);
    PyMem_Free(t);
    PyMem_Free(entries);
    PyMem_Free(hashes);
    PyMem_Free(offsets);
    PyMem_Free(stamps);
    PyBuffer_Release(&view);
    return result;
}

/* -- consume_queue_entries: the bytes of a run of consume-queue entries --------------- */

/* docs/formats.md, "Consume queue" (tide/format/_consume_queue.py): an entry is
 * commitlog offset i64, size i32, tags code i64, big-endian. */
#define CQ_ENTRY_BYTES 20

PyDoc_STRVAR(consume_queue_entries_doc,
             "consume_queue_entries(commitlog_offsets, sizes, tags_codes)\n--\n\n"
             "tide.format.pack_entries of three lists (or tuples) of one length; None when\n"
             "they are not, or a value is not an int that fits (the reference then packs\n"
             "or raises). The reference: tide.format._consume_queue.pack_entries_python.");

static PyObject *consume_queue_entries(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *offsets, *sizes, *codes;
    if (!PyArg_ParseTuple(args, "OOO:consume_queue_entries", &offsets, &sizes, &codes)) {
        return NULL;
    }
    if (!(PyList_CheckExact(offsets) || PyTuple_CheckExact(offsets)) ||
        !(PyList_CheckExact(sizes) || PyTuple_CheckExact(sizes)) ||
        !(PyList_CheckExact(codes) || PyTuple_CheckExact(codes))) {
        Py_RETURN_NONE;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(offsets);
    if (PySequence_Fast_GET_SIZE(sizes) != count || PySequence_Fast_GET_SIZE(codes) != count ||
        count > PY_SSIZE_T_MAX / CQ_ENTRY_BYTES) {
        Py_RETURN_NONE;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * CQ_ENTRY_BYTES);
    if (out == NULL) {
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    long long last_size = 0, last_code = 0;
    PyObject *last_size_obj = NULL, *last_code_obj = NULL; /* (borrowed: repeats skip) */
    for (Py_ssize_t i = 0; i < count; i++, p += CQ_ENTRY_BYTES) {
        PyObject *o = PySequence_Fast_GET_ITEM(offsets, i);
        PyObject *s = PySequence_Fast_GET_ITEM(sizes, i);
        PyObject *c = PySequence_Fast_GET_ITEM(codes, i);
        if (!PyLong_CheckExact(o) || !PyLong_CheckExact(s) || !PyLong_CheckExact(c)) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        int offset_overflow = 0, size_overflow = 0, code_overflow = 0;
        long long offset = PyLong_AsLongLongAndOverflow(o, &offset_overflow);
        if (s != last_size_obj) {
            last_size = PyLong_AsLongLongAndOverflow(s, &size_overflow);
            last_size_obj = s;
        }
        if (c != last_code_obj) {
            last_code = PyLong_AsLongLongAndOverflow(c, &code_overflow);
            last_code_obj = c;
        }
        if (offset_overflow || size_overflow || code_overflow || last_size < INT32_MIN ||
            last_size > INT32_MAX) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        put_be64(p, offset);
        put_be32(p + 8, (uint32_t)(int32_t)last_size);
        put_be64(p + 12, last_code);
    }
    return out;
}

/* -- s25-core: the storage's checks of a producer's run in one call ------------------- */

/* check_run (issue 21 target 5): the layout scan of scan_run and the store's rules on it
 * (each topic resolved once, the sys_flag bits allowed, each queue id within its topic's
 * write queues, one key object per queue, None for a transaction prepared / rollback
 * record), returning what the append lock needs. Reference:
 * tide.format._run_check.check_run_python. */

#define CHECK_KEY_ARRAY 1024 /* queue ids below: their keys in an array; above: a dict */

typedef struct {
    PyObject *prefix; /* what resolve named the topic (the key's first item) */
    long long count;  /* its write queue count */
    PyObject **keys;  /* (prefix, queue id) per queue id below CHECK_KEY_ARRAY, or NULL */
    PyObject *more;   /* queue id -> key for the others, or NULL */
} CheckTopic;

typedef struct {
    CheckTopic *items;
    Py_ssize_t count, room;
} CheckTopics;

static void check_topics_free(CheckTopics *t) {
    for (Py_ssize_t i = 0; i < t->count; i++) {
        CheckTopic *e = &t->items[i];
        if (e->keys != NULL) {
            long long n = e->count < CHECK_KEY_ARRAY ? e->count : CHECK_KEY_ARRAY;
            for (long long q = 0; q < n; q++) {
                Py_XDECREF(e->keys[q]);
            }
            PyMem_Free(e->keys);
        }
        Py_XDECREF(e->more);
        Py_XDECREF(e->prefix);
    }
    PyMem_Free(t->items);
}

/* resolve(name, index) for a topic met for the first time, at record index: its entry
 * appended to t. -1: an error (resolve's own, or a malformed answer). */
static int check_topic_add(CheckTopics *t, PyObject *resolve, PyObject *name, Py_ssize_t index) {
    if (t->count == t->room) {
        Py_ssize_t room = 0;
        CheckTopic *items = grow_full(t->items, t->room, sizeof(CheckTopic), 4, &room);
        if (items == NULL) {
            return -1;
        }
        t->items = items;
        t->room = room;
    }
    PyObject *answer = PyObject_CallFunction(resolve, "On", name, index);
    if (answer == NULL) {
        return -1;
    }
    if (!PyTuple_Check(answer) || PyTuple_GET_SIZE(answer) != 2) {
        Py_DECREF(answer);
        PyErr_SetString(PyExc_TypeError, "check_run: resolve must answer (name, write queues)");
        return -1;
    }
    long long count = PyLong_AsLongLong(PyTuple_GET_ITEM(answer, 1));
    if (count == -1 && PyErr_Occurred()) {
        Py_DECREF(answer);
        return -1;
    }
    CheckTopic *e = &t->items[t->count++];
    e->prefix = Py_NewRef(PyTuple_GET_ITEM(answer, 0));
    e->count = count;
    e->keys = NULL;
    e->more = NULL;
    Py_DECREF(answer);
    return 0;
}

/* The key (prefix, queue_id) of a queue of topic e (0 <= queue_id < e->count), one
 * object per queue (borrowed: e keeps it). NULL: out of memory. */
static PyObject *check_key(CheckTopic *e, int32_t queue_id) {
    if (queue_id < CHECK_KEY_ARRAY) {
        if (e->keys == NULL) {
            long long n = e->count < CHECK_KEY_ARRAY ? e->count : CHECK_KEY_ARRAY;
            e->keys = PyMem_Calloc((size_t)n, sizeof(PyObject *));
            if (e->keys == NULL) {
                PyErr_NoMemory();
                return NULL;
            }
        }
        if (e->keys[queue_id] == NULL) {
            e->keys[queue_id] = Py_BuildValue("(Oi)", e->prefix, queue_id);
        }
        return e->keys[queue_id];
    }
    if (e->more == NULL && (e->more = PyDict_New()) == NULL) {
        return NULL;
    }
    PyObject *id = PyLong_FromLong(queue_id);
    if (id == NULL) {
        return NULL;
    }
    PyObject *key = PyDict_GetItemWithError(e->more, id); /* borrowed */
    if (key == NULL && !PyErr_Occurred()) {
        key = Py_BuildValue("(Oi)", e->prefix, queue_id);
        if (key != NULL) {
            int failed = PyDict_SetItem(e->more, id, key);
            Py_DECREF(key); /* the dict keeps it */
            key = failed ? NULL : key;
        }
    }
    Py_DECREF(id);
    return key;
}

/* Each record's topic entry (row_topic), resolve called once per topic in the order
 * first met. -1: an error. */
static int check_resolve(const RunRows *rows, PyObject *resolve, CheckTopics *t,
                         Py_ssize_t *row_topic) {
    PyObject *index_of = PyDict_New(); /* topic bytes -> entry number */
    if (index_of == NULL) {
        return -1;
    }
    int failed = 0;
    Py_ssize_t current = -1;
    for (Py_ssize_t i = 0; i < rows->count && !failed; i++) {
        if (i == 0 || rows->topics[i] != rows->topics[i - 1]) { /* a change of topic */
            PyObject *found = PyDict_GetItemWithError(index_of, rows->topics[i]);
            if (found != NULL) {
                current = PyLong_AsSsize_t(found);
            } else if (PyErr_Occurred()) {
                failed = 1;
                break;
            } else {
                PyObject *number = PyLong_FromSsize_t(t->count);
                failed = number == NULL || PyDict_SetItem(index_of, rows->topics[i], number) ||
                         check_topic_add(t, resolve, rows->topics[i], i);
                Py_XDECREF(number);
                current = t->count - 1;
            }
        }
        row_topic[i] = current;
    }
    Py_DECREF(index_of);
    return failed ? -1 : 0;
}

/* The keys column: 1 done, 0 a queue id outside its topic's write queues, -1 an error. */
static int check_keys(const RunRows *rows, CheckTopics *t, const Py_ssize_t *row_topic,
                      PyObject *keys) {
    for (Py_ssize_t i = 0; i < rows->count; i++) {
        CheckTopic *e = &t->items[row_topic[i]];
        int32_t queue_id = rows->recs[i].queue_id, tx = rows->recs[i].sys_flag & TX_MASK;
        if (queue_id < 0 || queue_id >= e->count) {
            return 0;
        }
        PyObject *key = Py_None;
        if (tx != TX_PREPARED && tx != TX_ROLLBACK && (key = check_key(e, queue_id)) == NULL) {
            return -1;
        }
        PyList_SET_ITEM(keys, i, Py_NewRef(key));
    }
    return 1;
}

/* (sizes, keys, store timestamp positions) of the checked rows. */
static PyObject *check_columns(const RunRows *rows, PyObject *keys) {
    PyObject *sizes = PyList_New(rows->count), *positions = PyList_New(rows->count);
    PyObject *result = NULL;
    if (sizes == NULL || positions == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < rows->count; i++) {
        const RunRecord *rec = &rows->recs[i];
        PyObject *size = column_int(i ? PyList_GET_ITEM(sizes, i - 1) : NULL, rec->total);
        /* store_timestamp: 32 bytes before the body */
        PyObject *pos = column_int(i ? PyList_GET_ITEM(positions, i - 1) : NULL,
                                   rec->body_pos - rows->starts[i] - 32);
        if (size == NULL || pos == NULL) {
            Py_XDECREF(size);
            Py_XDECREF(pos);
            goto done;
        }
        PyList_SET_ITEM(sizes, i, size);
        PyList_SET_ITEM(positions, i, pos);
    }
    result = PyTuple_Pack(3, sizes, keys, positions);
done:
    Py_XDECREF(sizes);
    Py_XDECREF(positions);
    return result;
}

/* The rows of the run: 1 all passed the layout checks, 0 one failed, -1 an error. */
static int check_scan(const unsigned char *d, Py_ssize_t len, long long max_body_bytes,
                      Py_ssize_t max_records, PyObject *held, RunRows *rows) {
    PyObject *topic = NULL;
    int64_t at = 0;
    while (at < len) {
        RunRecord rec;
        if (!run_record(d, at, len, max_body_bytes, &rec) || rows->count >= max_records) {
            return 0;
        }
        Py_ssize_t topic_len = (Py_ssize_t)(rec.name_end - rec.topic_at);
        if (topic == NULL || PyBytes_GET_SIZE(topic) != topic_len ||
            memcmp(PyBytes_AS_STRING(topic), d + rec.topic_at, (size_t)topic_len) != 0) {
            topic = PyBytes_FromStringAndSize((const char *)d + rec.topic_at, topic_len);
            if (topic == NULL || PyList_Append(held, topic)) {
                Py_XDECREF(topic);
                return -1;
            }
            Py_DECREF(topic); /* held keeps it */
        }
        if (rows_add(rows, at, &rec, topic)) {
            return -1;
        }
        at += rec.total;
    }
    return 1;
}

PyDoc_STRVAR(check_run_doc,
             "check_run(data, max_body_bytes, max_records, resolve, allowed_sys_flags)\n--\n\n"
             "scan_run's checks, then the store's: resolve(topic bytes, index of its first\n"
             "record) -> (name, write queue count) once per topic in the order met, every\n"
             "sys_flag within allowed_sys_flags, every queue id within its topic's write\n"
             "queues. (sizes, queue keys, store timestamp positions) with one (name,\n"
             "queue id) object per queue and None for a transaction prepared / rollback\n"
             "record; None when a layout check fails, False when a rule does (before\n"
             "resolve is called / after). Reference: tide.format._run_check.check_run_python.");

static PyObject *check_run(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    long long max_body_bytes, allowed;
    Py_ssize_t max_records;
    PyObject *resolve;
    if (!PyArg_ParseTuple(args, "y*LnOL:check_run", &view, &max_body_bytes, &max_records,
                          &resolve, &allowed)) {
        return NULL;
    }
    RunRows rows = {NULL, NULL, NULL, 0, 0};
    CheckTopics topics = {NULL, 0, 0};
    Py_ssize_t *row_topic = NULL;
    PyObject *keys = NULL, *result = NULL;
    PyObject *held = PyList_New(0); /* the topics met, kept alive until the end */
    int found;
    if (held == NULL || (found = check_scan(view.buf, view.len, max_body_bytes, max_records,
                                            held, &rows)) < 0) {
        goto done;
    }
    if (!found) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    row_topic = PyMem_Malloc((size_t)(rows.count ? rows.count : 1) * sizeof(Py_ssize_t));
    if (row_topic == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (check_resolve(&rows, resolve, &topics, row_topic)) {
        goto done;
    }
    long long flags = 0;
    for (Py_ssize_t i = 0; i < rows.count; i++) {
        flags |= rows.recs[i].sys_flag;
    }
    if (flags & ~allowed) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    if ((keys = PyList_New(rows.count)) == NULL ||
        (found = check_keys(&rows, &topics, row_topic, keys)) < 0) {
        goto done;
    }
    result = found ? check_columns(&rows, keys) : Py_NewRef(Py_False);
done:
    Py_XDECREF(keys); /* (a list with NULL items left by a failure is freed correctly) */
    check_topics_free(&topics);
    PyMem_Free(row_topic);
    PyMem_Free(rows.recs);
    PyMem_Free(rows.starts);
    PyMem_Free(rows.topics);
    Py_XDECREF(held);
    PyBuffer_Release(&view);
    return result;
}

/* -- end of s25-core ------------------------------------------------------------------ */
/* == The gateway's produce path (issue 21, part s25-gateway) ========================
 *
 * A ProduceRequest whose messages are each only a topic (one topic for all) and a body:
 * the common request of a high-throughput producer. scan_bodies tells such a request
 * from its serialized form in one pass without a Python object per message, and
 * encode_bodies_run lays its messages out as a record run (encode_run_v4's layout, the
 * UNIQ_KEY property only) reading the bodies from the same bytes. References:
 * tide.format._bodies_run.scan_bodies_python and encode_bodies_run_python.
 *
 * The wire: a ProduceRequest is field 1 (messages, length-delimited: tag 0x0A), field 2
 * (compact_results, varint: tag 0x10) and field 3 (pack_answers, varint: tag 0x18; the
 * two flags change only the answer); a ProduceMessage is field 1 (topic, 0x0A) and
 * field 2 (body, 0x12). Any other field, or either field of a message twice
 * or missing, and the request is not one of bodies only (the caller checks it field by
 * field, which names what is wrong). */

#define WIRE_MESSAGES_TAG 0x0A
#define WIRE_COMPACT_TAG 0x10
#define WIRE_PACK_ANSWERS_TAG 0x18
#define WIRE_TOPIC_TAG 0x0A
#define WIRE_BODY_TAG 0x12

/* The varint at d[*pos..end) into *value; 0, or -1 when cut short or over 10 bytes. */
static int wire_varint(const unsigned char *d, Py_ssize_t end, Py_ssize_t *pos,
                       uint64_t *value) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70 && *pos < end; shift += 7) {
        unsigned char byte = d[(*pos)++];
        v |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *value = v;
            return 0;
        }
    }
    return -1;
}

/* A length-delimited field's bytes after its tag at *pos: 0, or -1 when they overrun. */
static int wire_span(const unsigned char *d, Py_ssize_t end, Py_ssize_t *pos,
                     const unsigned char **at, Py_ssize_t *len) {
    uint64_t n;
    if (wire_varint(d, end, pos, &n) || n > (uint64_t)(end - *pos)) {
        return -1;
    }
    *at = d + *pos;
    *len = (Py_ssize_t)n;
    *pos += (Py_ssize_t)n;
    return 0;
}

typedef struct {
    const unsigned char *topic, *body;
    Py_ssize_t topic_len, body_len;
} BareMessage;

/* The message d[0..len) when it is exactly a topic and a body (each once, non-empty). */
static int bare_message(const unsigned char *d, Py_ssize_t len, BareMessage *m) {
    Py_ssize_t pos = 0;
    m->topic = m->body = NULL;
    while (pos < len) {
        unsigned char tag = d[pos++];
        const unsigned char **at;
        Py_ssize_t *field_len;
        if (tag == WIRE_TOPIC_TAG && m->topic == NULL) {
            at = &m->topic, field_len = &m->topic_len;
        } else if (tag == WIRE_BODY_TAG && m->body == NULL) {
            at = &m->body, field_len = &m->body_len;
        } else {
            return -1;
        }
        if (wire_span(d, len, &pos, at, field_len)) {
            return -1;
        }
    }
    return m->topic != NULL && m->body != NULL && m->topic_len > 0 && m->body_len > 0 ? 0 : -1;
}

/* The next message of the request at *pos: 1, 0 at the end, -1 when not bodies only. */
static int next_bare(const unsigned char *d, Py_ssize_t end, Py_ssize_t *pos, BareMessage *m) {
    while (*pos < end) {
        unsigned char tag = d[(*pos)++];
        if (tag == WIRE_COMPACT_TAG || tag == WIRE_PACK_ANSWERS_TAG) {
            uint64_t ignored;
            if (wire_varint(d, end, pos, &ignored)) {
                return -1;
            }
            continue;
        }
        const unsigned char *at;
        Py_ssize_t len;
        if (tag != WIRE_MESSAGES_TAG || wire_span(d, end, pos, &at, &len)) {
            return -1;
        }
        return bare_message(at, len, m) ? -1 : 1;
    }
    return 0;
}

/* The count of the request's messages when they are bodies only of one topic, each body
 * at most max_body bytes (*topic: the first's); -1 when not; 0 for no message. */
static Py_ssize_t count_bare(const unsigned char *d, Py_ssize_t len, Py_ssize_t max_body,
                             BareMessage *first) {
    Py_ssize_t pos = 0, count = 0;
    BareMessage m;
    int more;
    while ((more = next_bare(d, len, &pos, &m)) == 1) {
        if (m.body_len > max_body) {
            return -1;
        }
        if (count == 0) {
            *first = m;
        } else if (m.topic_len != first->topic_len ||
                   memcmp(m.topic, first->topic, (size_t)m.topic_len) != 0) {
            return -1;
        }
        count++;
    }
    return more < 0 ? -1 : count;
}

PyDoc_STRVAR(scan_bodies_doc,
             "scan_bodies(request, max_body_bytes)\n--\n\n"
             "(topic as UTF-8 bytes, message count) when the serialized ProduceRequest has\n"
             "messages of one topic, each only that topic and a body of 1..max_body_bytes\n"
             "bytes (besides, only compact_results and pack_answers); else None. Reference:\n"
             "tide.format._bodies_run.scan_bodies_python.");

static PyObject *scan_bodies(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer wire;
    Py_ssize_t max_body;
    if (!PyArg_ParseTuple(args, "y*n:scan_bodies", &wire, &max_body)) {
        return NULL;
    }
    BareMessage first;
    Py_ssize_t count = count_bare(wire.buf, wire.len, max_body, &first);
    PyObject *result = NULL;
    if (count <= 0) {
        result = Py_NewRef(Py_None);
    } else {
        result = Py_BuildValue("(y#n)", (const char *)first.topic, first.topic_len, count);
    }
    PyBuffer_Release(&wire);
    return result;
}

/* The UNIQ_KEY properties of key i: name \x01 key \x02 into out (of out_cap bytes); its
 * length, or -1 with an error set. */
static Py_ssize_t key_properties(PyObject *keys, Py_ssize_t i, const Py_buffer *name,
                                 unsigned char *out, Py_ssize_t out_cap) {
    PyObject *key = PyList_GET_ITEM(keys, i);
    Py_ssize_t key_len;
    const char *text = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, &key_len) : NULL;
    if (text == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError, "encode_bodies_run: unique key %zd is not a str", i);
        }
        return -1;
    }
    Py_ssize_t len = name->len + key_len + 2;
    if (len > out_cap) {
        PyErr_Format(PyExc_ValueError, "encode_bodies_run: unique key %zd is too long", i);
        return -1;
    }
    memcpy(out, name->buf, (size_t)name->len);
    out[name->len] = 1;
    memcpy(out + name->len + 1, text, (size_t)key_len);
    out[len - 1] = 2;
    return len;
}

/* The run's size for the request's messages, or -1 with an error set. */
static Py_ssize_t bodies_run_size(const Py_buffer *wire, PyObject *keys, const Py_buffer *name,
                                  Py_ssize_t fixed, unsigned char *scratch) {
    Py_ssize_t pos = 0, count = 0, total = 0, count_keys = PyList_GET_SIZE(keys);
    BareMessage m;
    int more;
    while ((more = next_bare(wire->buf, wire->len, &pos, &m)) == 1) {
        if (count >= count_keys) {
            break;
        }
        Py_ssize_t props = key_properties(keys, count, name, scratch, 65535);
        if (props < 0) {
            return -1;
        }
        if (m.body_len > INT32_MAX - fixed - 65535) {
            PyErr_Format(PyExc_ValueError, "encode_bodies_run: body %zd does not fit a record",
                         count);
            return -1;
        }
        total += fixed + m.body_len + props;
        count++;
    }
    if (more < 0 || count != count_keys || (more == 1 && count >= count_keys)) {
        PyErr_SetString(PyExc_ValueError,
                        "encode_bodies_run: not a request of bodies only with one unique key "
                        "per message (scan_bodies it first)");
        return -1;
    }
    return total;
}

static void put_bodies(unsigned char *out, const RunHeader *h, int32_t queue_id,
                       const Py_buffer *wire, PyObject *keys, const Py_buffer *name,
                       unsigned char *scratch) {
    Py_ssize_t pos = 0, i = 0;
    BareMessage m;
    while (next_bare(wire->buf, wire->len, &pos, &m) == 1) {
        Py_buffer body = {.buf = (void *)m.body, .len = m.body_len};
        Py_buffer prop = {.buf = scratch};
        prop.len = key_properties(keys, i++, name, scratch, 65535); /* sized before */
        out = put_record(out, h, queue_id, &body, &prop);
    }
}

PyDoc_STRVAR(encode_bodies_run_doc,
             "encode_bodies_run(request, magic, topic_part, queue_id, unique_keys,\n"
             "                  uniq_key_name, born_ms, born_host)\n--\n\n"
             "The messages of a serialized ProduceRequest that scan_bodies took, as one run\n"
             "of records to queue_id (encode_run_v4's layout), message i's properties\n"
             "uniq_key_name \\x01 unique_keys[i] \\x02. Reference:\n"
             "tide.format._bodies_run.encode_bodies_run_python.");

static PyObject *encode_bodies_run(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer wire, topic_part, name, born_host;
    PyObject *keys;
    int queue_id;
    RunHeader h;
    if (!PyArg_ParseTuple(args, "y*iy*iO!y*Ly*:encode_bodies_run", &wire, &h.magic,
                          &topic_part, &queue_id, &PyList_Type, &keys, &name, &h.born_ms,
                          &born_host)) {
        return NULL;
    }
    PyObject *result = NULL;
    unsigned char *scratch = PyMem_Malloc(65535);
    if (scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (born_host.len != 8) {
        PyErr_SetString(PyExc_ValueError,
                        "encode_bodies_run: the born host must be 8 bytes (IPv4)");
        goto done;
    }
    h.topic_part = topic_part.buf;
    h.topic_part_len = topic_part.len;
    h.born_host = born_host.buf;
    Py_ssize_t fixed = FIXED_BYTES_V4 - 1 + topic_part.len;
    Py_ssize_t size = bodies_run_size(&wire, keys, &name, fixed, scratch);
    if (size < 0 || (result = PyBytes_FromStringAndSize(NULL, size)) == NULL) {
        goto done;
    }
    put_bodies((unsigned char *)PyBytes_AS_STRING(result), &h, (int32_t)queue_id, &wire, keys,
               &name, scratch);
done:
    PyMem_Free(scratch);
    PyBuffer_Release(&wire);
    PyBuffer_Release(&topic_part);
    PyBuffer_Release(&name);
    PyBuffer_Release(&born_host);
    return result;
}

PyDoc_STRVAR(numbered_keys_doc,
             "numbered_keys(head, first, count)\n--\n\n"
             "[head + the 4 upper-case hex digits of (first + i) & 0xFFFF for i in\n"
             "range(count)]: a batch's unique keys (head: ASCII). Reference:\n"
             "tide.format._bodies_run.numbered_keys_python.");

static PyObject *numbered_keys(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *head;
    Py_ssize_t first, count;
    if (!PyArg_ParseTuple(args, "Unn:numbered_keys", &head, &first, &count)) {
        return NULL;
    }
    if (!PyUnicode_IS_ASCII(head) || count < 0) {
        PyErr_SetString(PyExc_ValueError, "numbered_keys: an ASCII head and a count >= 0");
        return NULL;
    }
    static const char hex[] = "0123456789ABCDEF";
    Py_ssize_t head_len = PyUnicode_GET_LENGTH(head);
    const char *head_text = (const char *)PyUnicode_DATA(head);
    PyObject *keys = PyList_New(count);
    for (Py_ssize_t i = 0; keys != NULL && i < count; i++) {
        PyObject *key = PyUnicode_New(head_len + 4, 127);
        if (key == NULL) {
            Py_CLEAR(keys);
            break;
        }
        char *out = (char *)PyUnicode_DATA(key);
        unsigned counter = (unsigned)((size_t)first + (size_t)i) & 0xFFFF;
        memcpy(out, head_text, (size_t)head_len);
        for (int digit = 0; digit < 4; digit++) {
            out[head_len + digit] = hex[(counter >> (12 - 4 * digit)) & 0xF];
        }
        PyList_SET_ITEM(keys, i, key);
    }
    return keys;
}

/* == end of the gateway's produce path ============================================= */

/* == the dispatch apply's per-batch columns (issue 21 target 4, part s26-dispatch) ====
 * What DispatchStore.apply and the tail cache did in Python between the compiled calls,
 * once per batch: the record ends, each queue's records as columns, the runs of records
 * back to back. References: tide/format/_dispatch_columns.py. Each declines (None) what
 * it does not take (columns that are not exact lists or array('q') of one length, an int
 * that does not fit, too many queues) and the reference answers instead. */

/* Borrowed items of an exact list, as long longs; 0 (no exception set) when one is not an
 * exact int or does not fit. */
static int list_as_ll(PyObject *list, long long *out, Py_ssize_t count) {
    PyObject *last = NULL;
    long long value = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (item != last) {
            int overflow = 0;
            if (!PyLong_CheckExact(item)) {
                return 0;
            }
            value = PyLong_AsLongLongAndOverflow(item, &overflow);
            if (overflow || (value == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                return 0;
            }
            last = item;
        }
        out[i] = value;
    }
    return 1;
}

/* A column's count values as long longs: an exact list (list_as_ll) or an int64 buffer
 * (array('q')); 0 (no exception set) for anything else. */
static int column_as_ll(PyObject *col, long long *out, Py_ssize_t count) {
    if (PyList_CheckExact(col)) {
        return list_as_ll(col, out, count);
    }
    return int64_column(col, out, count);
}

/* 1 when each column is an exact list or an int64 buffer and all have one length
 * (*count); 0 (no exception set) otherwise. */
static int exact_lists(PyObject *const *lists, int how_many, Py_ssize_t *count) {
    for (int k = 0; k < how_many; k++) {
        Py_ssize_t n = column_length(lists[k]);
        if (n < 0 || (k > 0 && n != *count)) {
            return 0;
        }
        *count = n;
    }
    return 1;
}

/* queue_entry_runs: more queues than this in one batch declines (the reference groups them). */
#define QUEUE_RUNS_MAX_QUEUES 64
#define TX_MASK (3 << 2)
#define TX_PREPARED (1 << 2)
#define TX_ROLLBACK (3 << 2)

typedef struct {
    PyObject *topic;  /* borrowed: the first record's topic object of this queue */
    long long queue_id;
    Py_ssize_t first; /* the first record of this queue (queue-less or not) */
    Py_ssize_t taken; /* its records that take an entry */
    long long first_offset; /* the queue offset of its first record taking one */
    int consecutive;
} QueueRun;

/* The group of (topic, queue_id): the last one met first (records come in runs), then the
 * others; -1 with no exception: a new queue; -2: an error (set). */
static int queue_run_of(QueueRun *runs, int count, int last, PyObject *topic, long long id) {
    for (int k = -1; k < count; k++) {
        int g = k < 0 ? last : k;
        if (g < 0 || (k >= 0 && g == last) || runs[g].queue_id != id) {
            continue;
        }
        if (runs[g].topic == topic) {
            return g;
        }
        int equal = PyUnicode_Compare(runs[g].topic, topic);
        if (equal == -1 && PyErr_Occurred()) {
            return -2;
        }
        if (equal == 0) {
            return g;
        }
    }
    return -1;
}

/* The commitlog offsets, sizes and tags codes (in[0..2]) as long longs into out (three
 * columns of count); 0 when one is not an exact int that fits, or a size not in 32 bits. */
static int entry_columns(PyObject *const *in, long long *out, Py_ssize_t count) {
    if (!column_as_ll(in[0], out, count) || !column_as_ll(in[1], out + count, count) ||
        !column_as_ll(in[2], out + 2 * count, count)) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (out[count + i] < INT32_MIN || out[count + i] > INT32_MAX) {
            return 0;
        }
    }
    return 1;
}

/* Each queue's entries' bytes (entries[g], new; NULL for a queue taking none): its
 * records' (offset, size, tags code) packed in order, in one pass over the records. */
static int queue_entries_bytes(const QueueRun *runs, int groups, const int *group_of,
                               const long long *cols, Py_ssize_t count, PyObject **entries) {
    unsigned char *at[QUEUE_RUNS_MAX_QUEUES];
    for (int g = 0; g < groups; g++) {
        entries[g] = NULL;
    }
    for (int g = 0; g < groups; g++) {
        if (runs[g].taken == 0) {
            continue;
        }
        entries[g] = PyBytes_FromStringAndSize(NULL, runs[g].taken * CQ_ENTRY_BYTES);
        if (entries[g] == NULL) {
            return 0;
        }
        at[g] = (unsigned char *)PyBytes_AS_STRING(entries[g]);
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        int g = group_of[i];
        if (g < 0) {
            continue;
        }
        unsigned char *p = at[g];
        put_be64(p, cols[i]);
        put_be32(p + 8, (uint32_t)(int32_t)cols[count + i]);
        put_be64(p + 12, cols[2 * count + i]);
        at[g] = p + CQ_ENTRY_BYTES;
    }
    return 1;
}

/* A non-consecutive queue's queue offsets (qos: the batch's), as a list. */
static PyObject *queue_offsets_list(const QueueRun *r, int g, const int *group_of,
                                    const long long *qos, Py_ssize_t count) {
    PyObject *out = PyList_New(r->taken);
    Py_ssize_t at = 0;
    for (Py_ssize_t i = r->first; out != NULL && i < count; i++) {
        if (group_of[i] == g) {
            PyObject *value = PyLong_FromLongLong(qos[i]);
            if (value == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, at++, value);
        }
    }
    return out;
}

static PyObject *queue_entry_runs_answer(const QueueRun *runs, int groups, const int *group_of,
                                         const long long *qos, const long long *cols,
                                         Py_ssize_t count) {
    PyObject *entries[QUEUE_RUNS_MAX_QUEUES];
    PyObject *out = NULL;
    if (queue_entries_bytes(runs, groups, group_of, cols, count, entries)) {
        out = PyList_New(0);
    }
    for (int g = 0; out != NULL && g < groups; g++) {
        const QueueRun *r = &runs[g];
        if (r->taken == 0) {
            continue;
        }
        PyObject *id = PyLong_FromLongLong(r->queue_id);
        PyObject *first = r->consecutive
                              ? PyLong_FromLongLong(r->first_offset)
                              : queue_offsets_list(r, g, group_of, qos, count);
        PyObject *item = (id == NULL || first == NULL)
                             ? NULL
                             : PyTuple_Pack(4, r->topic, id, first, entries[g]);
        Py_XDECREF(id);
        Py_XDECREF(first);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(item);
    }
    for (int g = 0; g < groups; g++) {
        Py_XDECREF(entries[g]);
    }
    return out;
}

PyDoc_STRVAR(queue_entry_runs_doc,
             "queue_entry_runs(topics, queue_ids, sys_flags, queue_offsets, offsets, sizes,\n"
             "codes)\n--\n\n"
             "A batch's records that take a consume-queue entry (not a transaction's\n"
             "prepared or rollback record), grouped by (topic, queue id) in the order the\n"
             "queues are first met: [(topic, queue_id, queue offsets, entries)], the queue\n"
             "offsets an int (the first) when they are consecutive and more than one, else a\n"
             "list, the entries each record's (offset, size, tags code) packed as\n"
             "consume_queue_entries does. None when the columns are not of one length, the\n"
             "topics an exact list of str, the others exact lists of ints that fit in 64 bits\n"
             "or array('q') (a size in 32 bits), or hold more than 64 queues. Reference:\n"
             "tide.format._dispatch_columns.queue_entry_runs_python.");

static PyObject *queue_entry_runs(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *in[7]; /* offsets, sizes, codes, queue_offsets, topics, queue_ids, flags */
    if (!PyArg_ParseTuple(args, "OOOOOOO", &in[4], &in[5], &in[6], &in[3], &in[0], &in[1],
                          &in[2])) {
        return NULL;
    }
    Py_ssize_t count = 0;
    if (!exact_lists(in, 7, &count) || !PyList_CheckExact(in[4])) {
        Py_RETURN_NONE;
    }
    long long *cols = PyMem_Malloc(sizeof(long long) * (size_t)(6 * count + 1));
    int *group_of = PyMem_Malloc(sizeof(int) * (size_t)(count + 1));
    QueueRun runs[QUEUE_RUNS_MAX_QUEUES];
    int groups = 0, last = -1;
    PyObject *out = NULL;
    if (cols == NULL || group_of == NULL) {
        out = PyErr_NoMemory();
        goto done;
    }
    long long *ids = cols, *flags = cols + count, *qos = cols + 2 * count;
    if (!column_as_ll(in[5], ids, count) || !column_as_ll(in[6], flags, count) ||
        !column_as_ll(in[3], qos, count) || !entry_columns(in, cols + 3 * count, count)) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *topic = PyList_GET_ITEM(in[4], i);
        if (!PyUnicode_CheckExact(topic)) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        int g = queue_run_of(runs, groups, last, topic, ids[i]);
        if (g == -2) {
            goto done;
        }
        if (g == -1) {
            if (groups == QUEUE_RUNS_MAX_QUEUES) {
                out = Py_NewRef(Py_None);
                goto done;
            }
            g = groups++;
            runs[g] = (QueueRun){.topic = topic, .queue_id = ids[i], .first = i};
        }
        last = g;
        long long tx = flags[i] & TX_MASK;
        if (tx == TX_PREPARED || tx == TX_ROLLBACK) {
            group_of[i] = -1;
            continue;
        }
        group_of[i] = g;
        QueueRun *r = &runs[g];
        if (r->taken == 0) {
            r->first_offset = qos[i];
            r->consecutive = 1;
        } else if (r->consecutive &&
                   (r->first_offset > LLONG_MAX - r->taken || qos[i] != r->first_offset + r->taken)) {
            r->consecutive = 0;
        }
        r->taken++;
    }
    for (int g = 0; g < groups; g++) {
        if (runs[g].taken < 2) {
            runs[g].consecutive = 0;
        }
    }
    out = queue_entry_runs_answer(runs, groups, group_of, qos, cols + 3 * count, count);
done:
    PyMem_Free(cols);
    PyMem_Free(group_of);
    return out;
}

PyDoc_STRVAR(back_to_back_runs_doc,
             "back_to_back_runs(offsets, positions, sizes)\n--\n\n"
             "A batch's records as runs back to back both in the commitlog and in its data:\n"
             "[(start offset, end offset, position of start)], a record joining the run\n"
             "before it when it starts where that run ends in both. None when the columns\n"
             "are not exact lists or array('q') of one length (>= 1), of ints that fit in\n"
             "63 bits.\n"
             "Reference: tide.format._dispatch_columns.back_to_back_runs_python.");

static PyObject *back_to_back_runs(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *in[3];
    if (!PyArg_ParseTuple(args, "OOO:back_to_back_runs", &in[0], &in[1], &in[2])) {
        return NULL;
    }
    Py_ssize_t count = 0;
    if (!exact_lists(in, 3, &count) || count == 0) {
        Py_RETURN_NONE;
    }
    long long *cols = PyMem_Malloc(sizeof(long long) * (size_t)(3 * count));
    if (cols == NULL) {
        return PyErr_NoMemory();
    }
    long long *offsets = cols, *positions = cols + count, *sizes = cols + 2 * count;
    PyObject *out = NULL;
    const long long limit = LLONG_MAX / 4; /* sums below cannot overflow */
    if (!column_as_ll(in[0], offsets, count) || !column_as_ll(in[1], positions, count) ||
        !column_as_ll(in[2], sizes, count)) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (offsets[i] < -limit || offsets[i] > limit || positions[i] < -limit ||
            positions[i] > limit || sizes[i] < -limit || sizes[i] > limit) {
            out = Py_NewRef(Py_None);
            goto done;
        }
    }
    out = PyList_New(0);
    long long start = offsets[0], position = positions[0], end = offsets[0] + sizes[0];
    for (Py_ssize_t i = 1; out != NULL && i <= count; i++) {
        if (i < count && offsets[i] == end && positions[i] == position + (end - start)) {
            end += sizes[i];
            continue;
        }
        PyObject *run = Py_BuildValue("(LLL)", start, end, position);
        if (run == NULL || PyList_Append(out, run) < 0) {
            Py_XDECREF(run);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(run);
        if (i < count) {
            start = offsets[i], position = positions[i], end = offsets[i] + sizes[i];
        }
    }
done:
    PyMem_Free(cols);
    return out;
}

/* == end of the dispatch apply's per-batch columns =================================== */

/* == the gateway's FIFO produce: a batch's messages by queue (issue 21, part s27-fifo) ==
 * A Produce whose messages each carry a sharding key (a FIFO topic's message group) is
 * split by the queue each key hashes to (RocketMQ's SelectMessageQueueByHash), then
 * encoded one run per queue. Reference: tide/format/_sharding_groups.py. */

/* Bound on the queues of one topic this takes (a table of that many ints); above it
 * the reference answers. */
#define SHARDING_GROUPS_MAX_QUEUES 65536

/* Java's String.hashCode() over the key's UTF-16 code units (a code point above the BMP
 * counts as its two surrogates; lone surrogates as they are), as an unsigned 32-bit sum. */
static uint32_t java_hash_str(PyObject *key) {
    int kind = PyUnicode_KIND(key);
    const void *data = PyUnicode_DATA(key);
    Py_ssize_t len = PyUnicode_GET_LENGTH(key);
    uint32_t h = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c > 0xFFFF) {
            c -= 0x10000;
            h = h * 31u + (uint32_t)(0xD800 + (c >> 10));
            h = h * 31u + (uint32_t)(0xDC00 + (c & 0x3FF));
        } else {
            h = h * 31u + (uint32_t)c;
        }
    }
    return h;
}

/* Math.abs(hashCode % count): Java's remainder keeps the sign; abs(a % n) == abs(a) % n. */
static Py_ssize_t sharding_index(uint32_t h, Py_ssize_t count) {
    int64_t signed_h = (int32_t)h;
    int64_t magnitude = signed_h < 0 ? -signed_h : signed_h;
    return (Py_ssize_t)(magnitude % (int64_t)count);
}

/* [(queue index, [positions])] from each key's queue index (index_of) and its group's size. */
static PyObject *sharding_groups_answer(const Py_ssize_t *index_of, Py_ssize_t n,
                                        const int *group_of_queue, const Py_ssize_t *first_of,
                                        const Py_ssize_t *size_of, int groups) {
    PyObject *out = PyList_New(groups);
    Py_ssize_t *filled = PyMem_Calloc((size_t)groups + 1, sizeof(Py_ssize_t));
    if (out == NULL || filled == NULL) {
        Py_XDECREF(out);
        PyMem_Free(filled);
        return filled == NULL ? PyErr_NoMemory() : NULL;
    }
    for (int g = 0; g < groups; g++) {
        PyObject *positions = PyList_New(size_of[g]);
        PyObject *item =
            positions == NULL ? NULL : Py_BuildValue("(nN)", index_of[first_of[g]], positions);
        if (item == NULL) {
            Py_DECREF(out);
            PyMem_Free(filled);
            return NULL;
        }
        PyList_SET_ITEM(out, g, item);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int g = group_of_queue[index_of[i]];
        PyObject *positions = PyTuple_GET_ITEM(PyList_GET_ITEM(out, g), 1);
        PyObject *position = PyLong_FromSsize_t(i);
        if (position == NULL) {
            Py_DECREF(out);
            PyMem_Free(filled);
            return NULL;
        }
        PyList_SET_ITEM(positions, filled[g]++, position);
    }
    PyMem_Free(filled);
    return out;
}

PyDoc_STRVAR(sharding_groups_doc,
             "sharding_groups(keys, count)\n--\n\n"
             "A batch's messages by the queue their sharding keys hash to among count\n"
             "queues (RocketMQ's SelectMessageQueueByHash, Math.abs(key.hashCode() %\n"
             "count)): [(queue index, [positions of its keys, in order])], the queues in\n"
             "the order their first key comes. None when keys is not an exact list of\n"
             "exact str or count is above 65536 (the reference answers); ValueError when\n"
             "count < 1. Reference: tide.format._sharding_groups.sharding_groups_python.");

static PyObject *sharding_groups(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *keys;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "On:sharding_groups", &keys, &count)) {
        return NULL;
    }
    if (count < 1) {
        PyErr_SetString(PyExc_ValueError, "sharding_groups: count must be >= 1");
        return NULL;
    }
    if (!PyList_CheckExact(keys) || count > SHARDING_GROUPS_MAX_QUEUES) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    Py_ssize_t *index_of = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(3 * n + 1));
    int *group_of_queue = PyMem_Malloc(sizeof(int) * (size_t)count);
    PyObject *out = NULL;
    if (index_of == NULL || group_of_queue == NULL) {
        out = PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t *first_of = index_of + n, *size_of = index_of + 2 * n; /* by group */
    for (Py_ssize_t q = 0; q < count; q++) {
        group_of_queue[q] = -1;
    }
    int groups = 0;
    PyObject *previous = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (key == previous) { /* a group's messages often come back to back */
            index_of[i] = index_of[i - 1];
        } else if (!PyUnicode_CheckExact(key)) {
            out = Py_NewRef(Py_None);
            goto done;
        } else {
            index_of[i] = sharding_index(java_hash_str(key), count);
            previous = key;
        }
        int g = group_of_queue[index_of[i]];
        if (g < 0) {
            g = group_of_queue[index_of[i]] = groups++;
            first_of[g] = i;
            size_of[g] = 0;
        }
        size_of[g]++;
    }
    out = sharding_groups_answer(index_of, n, group_of_queue, first_of, size_of, groups);
done:
    PyMem_Free(index_of);
    PyMem_Free(group_of_queue);
    return out;
}

/* == end of the gateway's FIFO produce ================================================ */
/* == entry_spans: GetQueueEntries' selection as record spans (s27-spans) ============
 *
 * The pull's hot path in the dispatch: the consume queue's raw entries (CQ_ENTRY_BYTES
 * each, consume_queue_entries' layout) picked and grouped into runs of records back to
 * back in the commitlog, without a Python object per entry. The rules and the reference:
 * tide.format._entry_spans.select_spans_python. */

#define CQ_POS_SIZE 8 /* after the commitlog offset (i64) */
#define CQ_POS_TAGS_CODE 12 /* after the size (i32) */
#define CQ_PRE_BLANK_SIZE INT32_MAX /* tide.format.PRE_BLANK_SIZE */
/* Tag codes one call holds in C (tide.limits.EXPRESSION_MAX_TAGS); more: the reference. */
#define SPANS_MAX_TAG_CODES 256

PyDoc_STRVAR(entry_spans_doc,
             "entry_spans(entries, first_offset, max_count, tag_codes, max_bytes, next_offset)\n"
             "--\n\n"
             "tide.format.select_spans over consume-queue entries' bytes: (spans, next_offset).\n"
             "ValueError when the length is not a multiple of 20; None (the reference then\n"
             "answers) when tag_codes is not a set of at most 256 ints that fit in 64 bits or\n"
             "an int argument does not fit. The reference:\n"
             "tide.format._entry_spans.select_spans_python.");

static int compare_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The set's ints, sorted, into codes; their count, or -1 when it is not a set of at most
 * SPANS_MAX_TAG_CODES ints that fit (no error set: the caller declines), -2 on an error. */
static Py_ssize_t sorted_tag_codes(PyObject *set, int64_t codes[SPANS_MAX_TAG_CODES]) {
    if (!PyAnySet_Check(set) || PySet_GET_SIZE(set) > SPANS_MAX_TAG_CODES) {
        return -1;
    }
    PyObject *it = PyObject_GetIter(set);
    if (it == NULL) {
        return -2;
    }
    Py_ssize_t count = 0;
    PyObject *item;
    while ((item = PyIter_Next(it)) != NULL) {
        int overflow = 0;
        long long value = PyLong_Check(item) && (PyLong_CheckExact(item) || PyBool_Check(item))
                              ? PyLong_AsLongLongAndOverflow(item, &overflow)
                              : 0;
        int fits = PyLong_Check(item) && (PyLong_CheckExact(item) || PyBool_Check(item)) &&
                   !overflow && count < SPANS_MAX_TAG_CODES;
        Py_DECREF(item);
        if (!fits) {
            Py_DECREF(it);
            return -1;
        }
        codes[count++] = value;
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        return -2;
    }
    qsort(codes, (size_t)count, sizeof(int64_t), compare_i64);
    return count;
}

static int has_code(const int64_t *codes, Py_ssize_t count, int64_t code) {
    Py_ssize_t lo = 0, hi = count;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (codes[mid] < code) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < count && codes[lo] == code;
}

/* One int argument as an int64, or 0 when it is not an int that fits (no error set). */
static int i64_arg(PyObject *o, int64_t *out) {
    if (!PyLong_Check(o)) {
        return 0;
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = value;
    return 1;
}

/* The span being built appended to spans (when it holds records); -1 on an error. */
static int close_span(PyObject *spans, int64_t start, int64_t size, int64_t count) {
    if (count == 0) {
        return 0;
    }
    PyObject *span = PyTuple_New(3);
    if (span == NULL) {
        return -1;
    }
    const int64_t fields[3] = {start, size, count};
    for (Py_ssize_t i = 0; i < 3; i++) {
        PyObject *value = PyLong_FromLongLong(fields[i]);
        if (value == NULL) {
            Py_DECREF(span);
            return -1;
        }
        PyTuple_SET_ITEM(span, i, value);
    }
    int failed = PyList_Append(spans, span);
    Py_DECREF(span);
    return failed;
}

typedef struct {
    int64_t first_offset, max_count, limit, next_offset;
    const int64_t *codes;
    Py_ssize_t code_count; /* 0: every tag */
} SpanArgs;

/* The selection over count entries at d into spans; the next offset, or -1 (error set)
 * via *failed. */
static int64_t select_into(const unsigned char *d, Py_ssize_t count, const SpanArgs *a,
                           PyObject *spans, int *failed) {
    int64_t next_offset = a->next_offset, taken = 0, total = 0;
    int64_t start = 0, size = 0, span_count = 0, end = 0;
    int has_end = 0; /* whether end is where the current span's records end */
    for (Py_ssize_t i = 0; i < count; i++, d += CQ_ENTRY_BYTES) {
        if (taken >= a->max_count) {
            break;
        }
        int64_t queue_offset = a->first_offset + (int64_t)i;
        int64_t offset = be64(d);
        int32_t entry_size = be32(d + CQ_POS_SIZE);
        int64_t code = be64(d + CQ_POS_TAGS_CODE);
        if ((entry_size == CQ_PRE_BLANK_SIZE && offset == 0 && code == 0) ||
            (a->code_count && !has_code(a->codes, a->code_count, code))) {
            next_offset = queue_offset + 1;
            continue;
        }
        total += entry_size;
        if (total > a->limit && taken) {
            *failed = close_span(spans, start, size, span_count);
            return queue_offset;
        }
        next_offset = queue_offset + 1;
        taken++;
        if (has_end && offset == end) {
            size += entry_size;
            span_count++;
        } else {
            if (close_span(spans, start, size, span_count) < 0) {
                *failed = 1;
                return 0;
            }
            start = offset, size = entry_size, span_count = 1;
        }
        /* past the int64 range no entry's offset can equal it */
        has_end = !__builtin_add_overflow(offset, (int64_t)entry_size, &end);
    }
    *failed = close_span(spans, start, size, span_count);
    return next_offset;
}

static PyObject *entry_spans(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    PyObject *first_in, *max_count_in, *codes_in, *max_bytes_in, *next_in;
    if (!PyArg_ParseTuple(args, "y*OOOOO:entry_spans", &view, &first_in, &max_count_in,
                          &codes_in, &max_bytes_in, &next_in)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (view.len % CQ_ENTRY_BYTES) {
        PyErr_Format(PyExc_ValueError,
                     "consume queue entries of %zd bytes: not a multiple of %d (one entry)",
                     view.len, CQ_ENTRY_BYTES);
        goto done;
    }
    Py_ssize_t count = view.len / CQ_ENTRY_BYTES;
    int64_t codes[SPANS_MAX_TAG_CODES];
    SpanArgs a = {.codes = codes};
    int64_t max_bytes = 0;
    Py_ssize_t code_count = sorted_tag_codes(codes_in, codes);
    if (code_count == -2) {
        goto done;
    }
    if (code_count == -1 || !i64_arg(first_in, &a.first_offset) ||
        !i64_arg(max_count_in, &a.max_count) || !i64_arg(max_bytes_in, &max_bytes) ||
        !i64_arg(next_in, &a.next_offset) || a.first_offset > INT64_MAX - count) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    a.code_count = code_count;
    a.limit = max_bytes ? max_bytes : INT64_MAX;
    PyObject *spans = PyList_New(0);
    if (spans == NULL) {
        goto done;
    }
    int failed = 0;
    int64_t next_offset = select_into(view.buf, count, &a, spans, &failed);
    if (failed) {
        Py_DECREF(spans);
        goto done;
    }
    result = Py_BuildValue("(NL)", spans, (long long)next_offset);
done:
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(first_unwritten_doc,
             "first_unwritten(entries)\n--\n\n"
             "tide.format.first_unwritten: the index of the first consume-queue entry that\n"
             "RocketMQ's recovery does not count as written (offset < 0 or size <= 0), or\n"
             "the entry count. ValueError when the length is not a multiple of 20. The\n"
             "reference: tide.format._consume_queue.first_unwritten_python.");

static PyObject *first_unwritten(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*:first_unwritten", &view)) {
        return NULL;
    }
    if (view.len % CQ_ENTRY_BYTES) {
        PyErr_Format(PyExc_ValueError,
                     "consume queue entries of %zd bytes: not a multiple of %d (one entry)",
                     view.len, CQ_ENTRY_BYTES);
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t count = view.len / CQ_ENTRY_BYTES, i = 0;
    const unsigned char *d = view.buf;
    for (; i < count; i++, d += CQ_ENTRY_BYTES) {
        if (be64(d) < 0 || be32(d + CQ_POS_SIZE) <= 0) {
            break;
        }
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(i);
}

/* == end of entry_spans ============================================================== */

/* == packed_varints: a packed repeated int64/int32 field's payload (protobuf) ========== */

PyDoc_STRVAR(packed_varints_doc,
             "packed_varints(values, /) -> bytes\n"
             "--\n\n"
             "tide.format.packed_varints: the payload of a packed repeated int64 or int32\n"
             "field as protobuf writes it, each value a base-128 varint, low group first,\n"
             "a negative value as its 64-bit two's complement (ten bytes). OverflowError\n"
             "for a value outside int64, TypeError for a non-int. The reference:\n"
             "tide.format._varint.packed_varints_python.");

/* The most bytes one varint takes: 64 bits in groups of 7. */
#define VARINT_MAX_BYTES 10

static PyObject *packed_varints(PyObject *self, PyObject *values) {
    (void)self;
    PyObject *seq = PySequence_Fast(values, "packed_varints takes a sequence of ints");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count > PY_SSIZE_T_MAX / VARINT_MAX_BYTES) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * VARINT_MAX_BYTES);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *start = (unsigned char *)PyBytes_AS_STRING(out), *p = start;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (!PyLong_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "packed_varints: values[%zd] is %.80s, not an int", i,
                         Py_TYPE(items[i])->tp_name);
            goto fail;
        }
        long long value = PyLong_AsLongLong(items[i]);
        if (value == -1 && PyErr_Occurred()) {
            goto fail; /* OverflowError: outside int64 */
        }
        uint64_t u = (uint64_t)value;
        while (u > 0x7F) {
            *p++ = (unsigned char)((u & 0x7F) | 0x80);
            u >>= 7;
        }
        *p++ = (unsigned char)u;
    }
    Py_DECREF(seq);
    if (_PyBytes_Resize(&out, p - start) < 0) {
        return NULL;
    }
    return out;
fail:
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}

/* == end of packed_varints ============================================================ */

static PyMethodDef methods[] = {
    {"scan_v4_run", scan_v4_run, METH_VARARGS, scan_v4_run_doc},
    {"dispatch_properties", dispatch_properties, METH_VARARGS, dispatch_properties_doc},
    {"scan_run", scan_run, METH_VARARGS, scan_run_doc},
    {"patch_run", patch_run, METH_VARARGS, patch_run_doc},
    {"replay_records", replay_records, METH_VARARGS, replay_records_doc},
    {"encode_run_v4", encode_run_v4, METH_VARARGS, encode_run_v4_doc},
    {"index_key_hashes_ascii", index_key_hashes_ascii, METH_VARARGS,
     index_key_hashes_ascii_doc},
    {"span_records", span_records, METH_VARARGS, span_records_doc},
    {"record_tags", record_tags, METH_VARARGS, record_tags_doc},
    {"v4_record_fields", v4_record_fields, METH_VARARGS, v4_record_fields_doc},
    {"put_index_keys", put_index_keys, METH_VARARGS, put_index_keys_doc},
    {"consume_queue_entries", consume_queue_entries, METH_VARARGS,
     consume_queue_entries_doc},
    /* s25-core */
    {"check_run", check_run, METH_VARARGS, check_run_doc},
    /* the gateway's produce path (s25-gateway) */
    {"scan_bodies", scan_bodies, METH_VARARGS, scan_bodies_doc},
    {"encode_bodies_run", encode_bodies_run, METH_VARARGS, encode_bodies_run_doc},
    {"numbered_keys", numbered_keys, METH_VARARGS, numbered_keys_doc},
    /* the dispatch apply's per-batch columns (s26-dispatch) */
    {"queue_entry_runs", queue_entry_runs, METH_VARARGS, queue_entry_runs_doc},
    {"back_to_back_runs", back_to_back_runs, METH_VARARGS, back_to_back_runs_doc},
    /* the gateway's FIFO produce (s27-fifo) */
    {"sharding_groups", sharding_groups, METH_VARARGS, sharding_groups_doc},
    /* GetQueueEntries' span selection (s27-spans) */
    {"entry_spans", entry_spans, METH_VARARGS, entry_spans_doc},
    {"first_unwritten", first_unwritten, METH_VARARGS, first_unwritten_doc},
    /* the storage's Append answer (s29) */
    {"packed_varints", packed_varints, METH_O, packed_varints_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tide.format._ccore",
    .m_doc = "The compiled twins of Tide's per-message loops (docs/performance.md).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__ccore(void) {
    PyObject *array_module = PyImport_ImportModule("array");
    if (array_module == NULL) {
        return NULL;
    }
    array_type = PyObject_GetAttrString(array_module, "array");
    Py_DECREF(array_module);
    if (array_type == NULL) {
        return NULL;
    }
    return PyModule_Create(&module);
}
