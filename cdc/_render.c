/* cdc._render: the Kafka publisher's hot path in C (optional speedup; cdc/log/kafka/fastpath.py).
 *
 * Plan.render turns a row image, as the staging log stores it (pgoutput TupleData, or one line
 * of a COPY text segment), into the envelope's JSON for that row image and for its key: exactly
 * the bytes the pure-Python path (cdc.envelope.EnvelopeRenderer.row/key + orjson.dumps) gives.
 * render_events does that for a whole run of stored events and wraps each in its envelope,
 * position headers and tombstone; encode_batch encodes records as Kafka batch bodies
 * (cdc/log/kafka/recordbatch.py). tests/unit/test_render_speedups.py checks all of it byte for
 * byte against the Python code, for every type and for odd input. No I/O here: bytes in, bytes
 * out.
 *
 * Only the common, canonical forms are converted in C: integers, strings, booleans,
 * timestamptz and dates as PostgreSQL prints them under cdc.session's settings. Any other
 * type, or a value not in its canonical form, goes through the column's Python converter and
 * orjson.dumps (the "generic" kind), so the C code never has to reproduce an edge case. When a
 * row cannot be rendered here at all (a NULL or unchanged key column, binary or malformed
 * tuple data, invalid UTF-8, a field count that does not match, a truncate), it is handed back
 * and the caller renders that row in Python, which raises the proper error where there is one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_COLUMNS 1664 /* PostgreSQL allows 1600 columns per table */

enum Kind { K_GENERIC = 0, K_INT = 1, K_STRING = 2, K_BOOL = 3, K_TIMESTAMPTZ = 4, K_DATE = 5 };
enum Format { F_TUPLEDATA = 0, F_COPY = 1 };
enum Flags { WANT_KEY = 1, WANT_ROW = 2, ALLOW_UNCHANGED = 4 };

/* ---- growable output buffer ------------------------------------------------------------ */
typedef struct {
    char *p;
    Py_ssize_t len, cap;
    char local[2048];
} Buf;

static void buf_init(Buf *b) { b->p = b->local; b->len = 0; b->cap = sizeof(b->local); }
static void buf_free(Buf *b) { if (b->p != b->local) PyMem_Free(b->p); }

static int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap * 2;
    while (cap < b->len + extra) cap *= 2;
    char *p = b->p == b->local ? PyMem_Malloc(cap) : PyMem_Realloc(b->p, cap);
    if (p == NULL) { PyErr_NoMemory(); return -1; }
    if (b->p == b->local) memcpy(p, b->local, b->len);
    b->p = p;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

static int buf_putc(Buf *b, char c) { return buf_put(b, &c, 1); }

static PyObject *buf_bytes(Buf *b) { return PyBytes_FromStringAndSize(b->p, b->len); }

/* ---- one column value as a span of (unescaped) bytes ------------------------------------------ */
typedef struct {
    const char *p;
    Py_ssize_t n;
    char kind; /* 't' text, 'n' NULL, 'u' unchanged TOAST */
} Span;

/* ---- the per-table plan ------------------------------------------------------------------------ */
typedef struct {
    PyObject_HEAD
    Py_ssize_t ncols, nkeys;
    unsigned char *kinds, *precisions;
    Py_ssize_t *key_idx;
    PyObject *names;        /* tuple of bytes: each column's name JSON-encoded, followed by ':' */
    PyObject *convs;        /* tuple of callables: the Python converters */
    PyObject *placeholders; /* tuple of bytes: the JSON of each column's unchanged-TOAST placeholder */
    PyObject *dumps;        /* orjson.dumps */
} Plan;

static PyTypeObject PlanType; /* defined below */

static void plan_dealloc(Plan *self) {
    PyMem_Free(self->kinds);
    PyMem_Free(self->precisions);
    PyMem_Free(self->key_idx);
    Py_XDECREF(self->names);
    Py_XDECREF(self->convs);
    Py_XDECREF(self->placeholders);
    Py_XDECREF(self->dumps);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int check_bytes_tuple(PyObject *t, Py_ssize_t n, const char *what) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != n) {
        PyErr_Format(PyExc_ValueError, "Plan: %s must be a tuple of %zd items", what, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(t, i))) {
            PyErr_Format(PyExc_TypeError, "Plan: %s must hold bytes", what);
            return -1;
        }
    return 0;
}

/* Plan(kinds: bytes, precisions: bytes, names: tuple[bytes], convs: tuple, placeholders: tuple[bytes],
 *      key_indexes: tuple[int], dumps) */
static int plan_init(Plan *self, PyObject *args, PyObject *kwds) {
    Py_buffer kinds, precisions;
    PyObject *names, *convs, *placeholders, *key_idx, *dumps;
    if (!PyArg_ParseTuple(args, "y*y*O!O!O!O!O:Plan", &kinds, &precisions, &PyTuple_Type, &names, &PyTuple_Type,
                          &convs, &PyTuple_Type, &placeholders, &PyTuple_Type, &key_idx, &dumps))
        return -1;
    int rc = -1;
    Py_ssize_t n = kinds.len;
    if (n > MAX_COLUMNS || precisions.len != n) {
        PyErr_SetString(PyExc_ValueError, "Plan: kinds and precisions must have one byte per column (<= 1664)");
        goto done;
    }
    if (check_bytes_tuple(names, n, "names") < 0 || check_bytes_tuple(placeholders, n, "placeholders") < 0) goto done;
    if (PyTuple_GET_SIZE(convs) != n) {
        PyErr_SetString(PyExc_ValueError, "Plan: convs must have one converter per column");
        goto done;
    }
    PyMem_Free(self->kinds); /* __init__ called again */
    PyMem_Free(self->precisions);
    PyMem_Free(self->key_idx);
    self->ncols = n;
    self->nkeys = PyTuple_GET_SIZE(key_idx);
    self->kinds = PyMem_Malloc(n + 1);
    self->precisions = PyMem_Malloc(n + 1);
    self->key_idx = PyMem_Malloc(sizeof(Py_ssize_t) * (self->nkeys + 1));
    if (!self->kinds || !self->precisions || !self->key_idx) { PyErr_NoMemory(); goto done; }
    memcpy(self->kinds, kinds.buf, n);
    memcpy(self->precisions, precisions.buf, n);
    for (Py_ssize_t i = 0; i < n; i++)
        if (self->kinds[i] > K_DATE || self->precisions[i] > 6) {
            PyErr_SetString(PyExc_ValueError, "Plan: unknown kind or precision");
            goto done;
        }
    for (Py_ssize_t j = 0; j < self->nkeys; j++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(key_idx, j));
        if (i == -1 && PyErr_Occurred()) goto done;
        if (i < 0 || i >= n) {
            PyErr_SetString(PyExc_ValueError, "Plan: key index out of range");
            goto done;
        }
        self->key_idx[j] = i;
    }
    Py_INCREF(names); Py_XSETREF(self->names, names);
    Py_INCREF(convs); Py_XSETREF(self->convs, convs);
    Py_INCREF(placeholders); Py_XSETREF(self->placeholders, placeholders);
    Py_INCREF(dumps); Py_XSETREF(self->dumps, dumps);
    rc = 0;
done:
    if (rc != 0) self->ncols = self->nkeys = 0; /* a half-built plan renders nothing */
    PyBuffer_Release(&kinds);
    PyBuffer_Release(&precisions);
    return rc;
}

/* ---- JSON strings, escaped exactly as orjson escapes them ------------------------------------- */
static const char HEX[] = "0123456789abcdef";

/* 0 ok, -1 Python error, 1 not valid UTF-8 (the caller falls back to Python) */
static int put_json_string(Buf *b, const char *s, Py_ssize_t n) {
    int ascii = 1;
    for (Py_ssize_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) { ascii = 0; break; }
    if (!ascii) { /* validate as Python's bytes.decode() does (strict UTF-8, no surrogates) */
        PyObject *u = PyUnicode_DecodeUTF8(s, n, NULL);
        if (u == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
            PyErr_Clear();
            return 1;
        }
        Py_DECREF(u);
    }
    Py_ssize_t escaped = n + 2; /* exact size: values can be large (TOAST, up to 1 GB) */
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20) escaped += (c == '\b' || c == '\t' || c == '\n' || c == '\f' || c == '\r') ? 1 : 5;
        else if (c == '"' || c == '\\') escaped += 1;
    }
    if (buf_reserve(b, escaped) < 0) return -1;
    char *o = b->p + b->len;
    *o++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') { *o++ = (char)c; continue; }
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\b': *o++ = 'b'; break;
        case '\t': *o++ = 't'; break;
        case '\n': *o++ = 'n'; break;
        case '\f': *o++ = 'f'; break;
        case '\r': *o++ = 'r'; break;
        default:
            *o++ = 'u'; *o++ = '0'; *o++ = '0';
            *o++ = HEX[c >> 4]; *o++ = HEX[c & 15];
        }
    }
    *o++ = '"';
    b->len = o - b->p;
    return 0;
}

/* ---- canonical forms converted in C ------------------------------------------------------------ */
static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* -?(0|[1-9][0-9]{0,17}): what PostgreSQL prints for an integer that surely fits int64. */
static int canonical_int(const char *s, Py_ssize_t n) {
    Py_ssize_t i = (n > 0 && s[0] == '-') ? 1 : 0;
    Py_ssize_t digits = n - i;
    if (digits < 1 || digits > 18) return 0;
    if (s[i] == '0' && (digits > 1 || i == 1)) return 0; /* leading zero, or "-0" */
    for (; i < n; i++)
        if (!is_digit(s[i])) return 0;
    return 1;
}

/* Decimal text of v into out (at least 21 bytes); returns the length. snprintf is slow here. */
static int format_lld(char *out, long long v) {
    char tmp[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do { tmp[n++] = (char)('0' + u % 10); u /= 10; } while (u);
    int len = 0;
    if (v < 0) out[len++] = '-';
    while (n) out[len++] = tmp[--n];
    return len;
}

static int64_t floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* cdc.pgdatetime.days_from_civil */
static int64_t days_from_civil(int64_t year, int64_t month, int64_t day) {
    int64_t shifted;
    if (month <= 2) { year -= 1; shifted = month + 9; }
    else shifted = month - 3;
    int64_t era = floordiv(year, 400);
    int64_t yoe = year - era * 400;
    int64_t doy = floordiv(153 * shifted + 2, 5) + day - 1;
    int64_t doe = yoe * 365 + floordiv(yoe, 4) - floordiv(yoe, 100) + doy;
    return era * 146097 + doe - 719468;
}

static int64_t digits_value(const char *s, int n) {
    int64_t v = 0;
    for (int i = 0; i < n; i++) v = v * 10 + (s[i] - '0');
    return v;
}

/* 'YYYY-MM-DD', all ASCII digits: cdc.pgdatetime.convert_date's common case. 1 when written. */
static int put_date(Buf *b, const char *s, Py_ssize_t n) {
    if (n != 10 || s[4] != '-' || s[7] != '-') return 0;
    for (int i = 0; i < 10; i++)
        if (i != 4 && i != 7 && !is_digit(s[i])) return 0;
    int64_t days = days_from_civil(digits_value(s, 4), digits_value(s + 5, 2), digits_value(s + 8, 2));
    char tmp[32];
    int len = format_lld(tmp, (long long)days);
    return buf_put(b, tmp, len) < 0 ? -1 : 1;
}

/* 'YYYY-MM-DD HH:MM:SS[.f{1,6}]+00': the fast path of cdc.pgdatetime.timestamptz_converter.
 * 1 when written, 0 when not this form, -1 error. */
static int put_timestamptz(Buf *b, const char *s, Py_ssize_t n, int precision) {
    for (Py_ssize_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0; /* Python indexes characters, we bytes */
    if (n < 22 || s[n - 3] != '+' || s[n - 2] != '0' || s[n - 1] != '0' || s[4] != '-' || s[10] != ' ') return 0;
    char frac[6] = {'0', '0', '0', '0', '0', '0'};
    if (n > 22) {
        if (s[19] != '.') return 0;
        Py_ssize_t digits = n - 23;
        if (digits < 1 || digits > 6) return 0;
        for (Py_ssize_t i = 0; i < digits; i++) {
            if (!is_digit(s[20 + i])) return 0;
            frac[i] = s[20 + i];
        }
    }
    char out[40];
    memcpy(out, s, 10);
    out[10] = 'T';
    memcpy(out + 11, s + 11, 8);
    int len = 19;
    if (precision > 0) {
        out[len++] = '.';
        memcpy(out + len, frac, precision);
        len += precision;
    }
    out[len++] = 'Z';
    int rc = put_json_string(b, out, len);
    return rc == 0 ? 1 : rc == 1 ? 0 : -1; /* not UTF-8 (odd verbatim bytes): let Python decide */
}

/* The column's Python converter, then orjson.dumps. 0 ok, -1 error, 1 fall back (not UTF-8). */
static int put_generic(Plan *plan, Py_ssize_t col, Buf *b, const char *s, Py_ssize_t n) {
    PyObject *text = PyUnicode_DecodeUTF8(s, n, NULL);
    if (text == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
        PyErr_Clear();
        return 1;
    }
    PyObject *value = PyObject_CallOneArg(PyTuple_GET_ITEM(plan->convs, col), text);
    Py_DECREF(text);
    if (value == NULL) return -1;
    PyObject *json = PyObject_CallOneArg(plan->dumps, value);
    Py_DECREF(value);
    if (json == NULL) return -1;
    int rc = PyBytes_Check(json) ? buf_put(b, PyBytes_AS_STRING(json), PyBytes_GET_SIZE(json)) : -1;
    if (rc < 0 && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "Plan: dumps must return bytes");
    Py_DECREF(json);
    return rc;
}

/* One non-NULL, changed value. 0 ok, -1 error, 1 fall back. */
static int put_value(Plan *plan, Py_ssize_t col, Buf *b, const char *s, Py_ssize_t n) {
    int rc;
    switch (plan->kinds[col]) {
    case K_INT:
        if (canonical_int(s, n)) return buf_put(b, s, n);
        break;
    case K_STRING:
        return put_json_string(b, s, n);
    case K_BOOL:
        if (n == 1 && s[0] == 't') return buf_put(b, "true", 4);
        if (n == 1 && s[0] == 'f') return buf_put(b, "false", 5);
        break;
    case K_TIMESTAMPTZ:
        rc = put_timestamptz(b, s, n, plan->precisions[col]);
        if (rc != 0) return rc < 0 ? -1 : 0;
        break;
    case K_DATE:
        rc = put_date(b, s, n);
        if (rc != 0) return rc < 0 ? -1 : 0;
        break;
    }
    return put_generic(plan, col, b, s, n);
}

static int put_name(Plan *plan, Py_ssize_t col, Buf *b, int first) {
    PyObject *name = PyTuple_GET_ITEM(plan->names, col);
    if (buf_putc(b, first ? '{' : ',') < 0) return -1;
    return buf_put(b, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name));
}

/* {"name":value,...} of the row image. 0 ok, -1 error, 1 fall back. */
static int put_row(Plan *plan, const Span *spans, Buf *b) {
    if (plan->ncols == 0) return buf_put(b, "{}", 2);
    for (Py_ssize_t i = 0; i < plan->ncols; i++) {
        if (put_name(plan, i, b, i == 0) < 0) return -1;
        int rc = 0;
        if (spans[i].kind == 'n') rc = buf_put(b, "null", 4);
        else if (spans[i].kind == 'u') {
            PyObject *ph = PyTuple_GET_ITEM(plan->placeholders, i);
            rc = buf_put(b, PyBytes_AS_STRING(ph), PyBytes_GET_SIZE(ph));
        } else rc = put_value(plan, i, b, spans[i].p, spans[i].n);
        if (rc != 0) return rc;
    }
    return buf_putc(b, '}');
}

/* {"key column":value,...}; 1 (fall back) when a key column is NULL or unchanged. */
static int put_key(Plan *plan, const Span *spans, Buf *b) {
    if (plan->nkeys == 0) return buf_put(b, "{}", 2);
    for (Py_ssize_t j = 0; j < plan->nkeys; j++) {
        Py_ssize_t i = plan->key_idx[j];
        if (spans[i].kind != 't') return 1;
        if (put_name(plan, i, b, j == 0) < 0) return -1;
        int rc = put_value(plan, i, b, spans[i].p, spans[i].n);
        if (rc != 0) return rc;
    }
    return buf_putc(b, '}');
}

/* ---- row images into spans --------------------------------------------------------------------- */
static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* pgoutput TupleData. 0 ok, 1 fall back (binary values, cut off, column count differs). */
static int spans_of_tupledata(const char *data, Py_ssize_t len, Py_ssize_t ncols, Span *spans) {
    const unsigned char *p = (const unsigned char *)data;
    if (len < 2) return 1;
    Py_ssize_t count = (p[0] << 8) | p[1];
    if (count != ncols) return 1;
    Py_ssize_t off = 2;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (off >= len) return 1;
        unsigned char kind = p[off];
        if (kind == 'n' || kind == 'u') {
            spans[i].kind = (char)kind;
            spans[i].p = NULL;
            spans[i].n = 0;
            off += 1;
        } else if (kind == 't') {
            if (off + 5 > len) return 1;
            uint32_t n = be32(p + off + 1);
            if (n > (uint32_t)(len - off - 5)) return 1;
            spans[i].kind = 't';
            spans[i].p = data + off + 5;
            spans[i].n = (Py_ssize_t)n;
            off += 5 + (Py_ssize_t)n;
        } else return 1;
    }
    return off == len ? 0 : 1;
}

/* One COPY text line (no newline): fields split at tabs, `\N` NULL, backslash escapes undone as
 * cdc.keys.unescape does, into `scratch` (at least len bytes). 0 ok, 1 fall back. */
static int spans_of_copy_line(const char *line, Py_ssize_t len, Py_ssize_t ncols, Span *spans, char *scratch) {
    Py_ssize_t col = 0, i = 0;
    char *o = scratch;
    for (;;) {
        Py_ssize_t start = i;
        int escaped = 0;
        while (i < len && line[i] != '\t') { /* every raw tab separates, as bytes.split does */
            if (line[i] == '\\') escaped = 1;
            i++;
        }
        if (col >= ncols) return 1;
        Span *s = &spans[col++];
        if (!escaped) {
            s->kind = 't'; s->p = line + start; s->n = i - start;
        } else if (i - start == 2 && line[start + 1] == 'N') {
            s->kind = 'n'; s->p = NULL; s->n = 0;
        } else {
            s->kind = 't'; s->p = o;
            for (Py_ssize_t k = start; k < i; k++) {
                char c = line[k];
                if (c == '\\' && k + 1 < i) {
                    char e = line[++k];
                    switch (e) {
                    case 'b': c = '\b'; break;
                    case 'f': c = '\f'; break;
                    case 'n': c = '\n'; break;
                    case 'r': c = '\r'; break;
                    case 't': c = '\t'; break;
                    case 'v': c = '\v'; break;
                    default: c = e;
                    }
                }
                *o++ = c;
            }
            s->n = o - s->p;
        }
        if (i >= len) break;
        i++; /* the tab */
    }
    return col == ncols ? 0 : 1;
}

enum Status { ST_OK = 0, ST_FALLBACK = 1, ST_UNCHANGED = 2, ST_ERROR = -1 };

/* One row image into `key` and/or `row` (either may be NULL): ST_OK, ST_FALLBACK (Python must
 * render it), ST_UNCHANGED (an unchanged TOAST value and flags lack ALLOW_UNCHANGED) or ST_ERROR. */
static int render_image(Plan *plan, const char *data, Py_ssize_t len, long format, long flags, Buf *key, Buf *row) {
    Span spans[MAX_COLUMNS];
    char local[4096];
    char *scratch = NULL;
    int rc;
    if (format == F_COPY) {
        scratch = len <= (Py_ssize_t)sizeof(local) ? local : PyMem_Malloc(len + 1);
        if (scratch == NULL) { PyErr_NoMemory(); return ST_ERROR; }
        rc = spans_of_copy_line(data, len, plan->ncols, spans, scratch);
    } else rc = spans_of_tupledata(data, len, plan->ncols, spans);
    if (rc != 0) { rc = ST_FALLBACK; goto done; }
    if (!(flags & ALLOW_UNCHANGED))
        for (Py_ssize_t i = 0; i < plan->ncols; i++)
            if (spans[i].kind == 'u') { rc = ST_UNCHANGED; goto done; }
    if (key != NULL && (rc = put_key(plan, spans, key)) != 0) goto done;
    if (row != NULL) rc = put_row(plan, spans, row);
done:
    if (scratch != NULL && scratch != local) PyMem_Free(scratch);
    return rc;
}

/* Plan.render(data, format, flags) -> (key JSON | None, row JSON | None), or None when Python
 * must render this row, or False when the row has an unchanged TOAST value and flags lack
 * ALLOW_UNCHANGED (the caller then fills it first). */
static PyObject *plan_render(Plan *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "render(data: bytes, format: int, flags: int)");
        return NULL;
    }
    long format = PyLong_AsLong(args[1]);
    long flags = PyLong_AsLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    Buf key, row;
    buf_init(&key);
    buf_init(&row);
    int rc = render_image(self, PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), format, flags,
                          (flags & WANT_KEY) ? &key : NULL, (flags & WANT_ROW) ? &row : NULL);
    PyObject *result = NULL;
    if (rc == ST_OK) {
        PyObject *k = (flags & WANT_KEY) ? buf_bytes(&key) : Py_NewRef(Py_None);
        PyObject *r = (flags & WANT_ROW) ? buf_bytes(&row) : Py_NewRef(Py_None);
        if (k != NULL && r != NULL) result = PyTuple_Pack(2, k, r);
        Py_XDECREF(k);
        Py_XDECREF(r);
    } else if (rc == ST_FALLBACK) result = Py_NewRef(Py_None);
    else if (rc == ST_UNCHANGED) result = Py_NewRef(Py_False);
    buf_free(&key);
    buf_free(&row);
    return result;
}

/* ---- Kafka records (message format v2), as cdc/log/kafka/recordbatch.py encodes them --------- */
static int varint_len(int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int n = 1;
    while (z > 0x7f) { z >>= 7; n++; }
    return n;
}

static char *put_varint(char *o, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (z > 0x7f) { *o++ = (char)((z & 0x7f) | 0x80); z >>= 7; }
    *o++ = (char)z;
    return o;
}

#define BATCH_HEADER_SIZE 61 /* recordbatch.HEADER.size */

/* encode_batch(records, start, limit) -> (bytes, count): the records from index `start` of a list
 * of (key, value, encoded headers) tuples (key/value None: null), encoded one after the other,
 * as many as fit in a batch of `limit` bytes (at least one): RecordBatchWriter.append's rule. */
static PyObject *encode_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "encode_batch(records: list, start: int, limit: int)");
        return NULL;
    }
    PyObject *records = args[0];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t total = PyList_GET_SIZE(records);
    if (start < 0 || start > total) {
        PyErr_SetString(PyExc_IndexError, "encode_batch: start out of range");
        return NULL;
    }
    Buf b;
    buf_init(&b);
    Py_ssize_t size = BATCH_HEADER_SIZE, count = 0;
    for (Py_ssize_t i = start; i < total; i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 3) goto bad;
        PyObject *key = PyTuple_GET_ITEM(rec, 0), *value = PyTuple_GET_ITEM(rec, 1), *headers = PyTuple_GET_ITEM(rec, 2);
        if ((key != Py_None && !PyBytes_Check(key)) || (value != Py_None && !PyBytes_Check(value)) || !PyBytes_Check(headers))
            goto bad;
        Py_ssize_t klen = key == Py_None ? -1 : PyBytes_GET_SIZE(key);
        Py_ssize_t vlen = value == Py_None ? -1 : PyBytes_GET_SIZE(value);
        Py_ssize_t hlen = PyBytes_GET_SIZE(headers);
        Py_ssize_t body = 2 + varint_len(count) + varint_len(klen) + (klen > 0 ? klen : 0) + varint_len(vlen) +
                          (vlen > 0 ? vlen : 0) + hlen;
        Py_ssize_t record = varint_len(body) + body;
        if (count && size + record > limit) break;
        if (buf_reserve(&b, record) < 0) { buf_free(&b); return NULL; }
        char *o = b.p + b.len;
        o = put_varint(o, body);
        *o++ = 0; /* attributes */
        *o++ = 0; /* timestamp delta: every record carries the batch's timestamp */
        o = put_varint(o, count);
        o = put_varint(o, klen);
        if (klen > 0) { memcpy(o, PyBytes_AS_STRING(key), klen); o += klen; }
        o = put_varint(o, vlen);
        if (vlen > 0) { memcpy(o, PyBytes_AS_STRING(value), vlen); o += vlen; }
        memcpy(o, PyBytes_AS_STRING(headers), hlen);
        o += hlen;
        b.len = o - b.p;
        size += record;
        count++;
    }
    PyObject *data = buf_bytes(&b);
    buf_free(&b);
    if (data == NULL) return NULL;
    PyObject *result = Py_BuildValue("(Nn)", data, count);
    return result;
bad:
    buf_free(&b);
    PyErr_SetString(PyExc_TypeError, "encode_batch: records must be (bytes | None, bytes | None, bytes) tuples");
    return NULL;
}

#define POSITION_HEADERS_MAX (1 + 4 * (1 + 7 + 1 + 21))

/* recordbatch.position_headers into `out` (POSITION_HEADERS_MAX bytes); returns the length. */
static Py_ssize_t write_position_headers(char *out, const long long values[4]) {
    static const char *names[4] = {"cdc.lsn", "cdc.seq", "cdc.ts", "cdc.sv"};
    char *o = put_varint(out, 4);
    for (int i = 0; i < 4; i++) {
        int nlen = (int)strlen(names[i]);
        o = put_varint(o, nlen);
        memcpy(o, names[i], nlen);
        o += nlen;
        char digits[24];
        int dlen = format_lld(digits, values[i]);
        o = put_varint(o, dlen);
        memcpy(o, digits, dlen);
        o += dlen;
    }
    return o - out;
}

/* position_headers(lsn, seq, commit_ts, schema_version) -> bytes: recordbatch.position_headers. */
static PyObject *position_headers(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "position_headers(lsn, seq, commit_ts, schema_version)");
        return NULL;
    }
    long long values[4];
    for (int i = 0; i < 4; i++) {
        values[i] = PyLong_AsLongLong(args[i]);
        if (values[i] == -1 && PyErr_Occurred()) return NULL;
    }
    char out[POSITION_HEADERS_MAX];
    return PyBytes_FromStringAndSize(out, write_position_headers(out, values));
}

/* ---- a run of stored events, rendered whole ---------------------------------------------------- */
#define EVENT_PIECES 10 /* EnvelopeRenderer.pieces: constant parts around the value's 9 slots */

static int put_piece(Buf *b, PyObject *pieces, int i) {
    PyObject *p = PyTuple_GET_ITEM(pieces, i);
    return buf_put(b, PyBytes_AS_STRING(p), PyBytes_GET_SIZE(p));
}

static int put_lld(Buf *b, long long v) {
    char tmp[24];
    int n = format_lld(tmp, v);
    return buf_put(b, tmp, n);
}

/* An int column of a stored row, 0 for NULL (is_none, when given, tells which). 0 ok, -1 error. */
static int row_int(PyObject *v, long long *out, int *is_none) {
    if (v == Py_None) { *out = 0; if (is_none) *is_none = 1; return 0; }
    if (is_none) *is_none = 0;
    *out = PyLong_AsLongLong(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int check_pieces(PyObject *pieces) {
    if (!PyTuple_Check(pieces) || PyTuple_GET_SIZE(pieces) != EVENT_PIECES) return -1;
    for (int i = 0; i < EVENT_PIECES; i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(pieces, i))) return -1;
    return 0;
}

/* One event row -> its key and value in kb/vb. ST_OK, ST_FALLBACK, ST_UNCHANGED or ST_ERROR.
 * Mirrors EnvelopeRenderer.key_json/value_json for ops c, r, u, d (truncates: ST_FALLBACK). */
static int render_event(Plan *plan, PyObject *pieces, char op, PyObject *payload, PyObject *before,
                        const long long pos[4], PyObject *xid_obj, PyObject *ts_obj, PyObject *elsn_obj,
                        long long now_ms, Buf *kb, Buf *vb) {
    int has_payload = PyBytes_Check(payload) && PyBytes_GET_SIZE(payload) > 0;
    int has_before = PyBytes_Check(before) && PyBytes_GET_SIZE(before) > 0;
    int rc;
    if (put_piece(vb, pieces, 0) < 0) return ST_ERROR;
    switch (op) {
    case 'c':
    case 'r':
        if (!has_payload) return ST_FALLBACK;
        if (buf_put(vb, "null", 4) < 0 || put_piece(vb, pieces, 1) < 0) return ST_ERROR;
        rc = render_image(plan, PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), F_TUPLEDATA,
                          WANT_KEY | WANT_ROW | ALLOW_UNCHANGED, kb, vb);
        break;
    case 'u':
        if (!has_payload) return ST_FALLBACK;
        if (has_before) {
            rc = render_image(plan, PyBytes_AS_STRING(before), PyBytes_GET_SIZE(before), F_TUPLEDATA,
                              WANT_ROW | ALLOW_UNCHANGED, NULL, vb);
            if (rc != ST_OK) return rc;
        } else if (buf_put(vb, "null", 4) < 0) return ST_ERROR;
        if (put_piece(vb, pieces, 1) < 0) return ST_ERROR;
        rc = render_image(plan, PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), F_TUPLEDATA,
                          WANT_KEY | WANT_ROW, kb, vb);
        break;
    case 'd':
        if (!has_before) return ST_FALLBACK;
        rc = render_image(plan, PyBytes_AS_STRING(before), PyBytes_GET_SIZE(before), F_TUPLEDATA,
                          WANT_KEY | WANT_ROW | ALLOW_UNCHANGED, kb, vb);
        if (rc == ST_OK && (put_piece(vb, pieces, 1) < 0 || buf_put(vb, "null", 4) < 0)) return ST_ERROR;
        break;
    default:
        return ST_FALLBACK;
    }
    if (rc != ST_OK) return rc;
    long long ts, xid, elsn;
    int ts_none, xid_none, elsn_none;
    if (row_int(ts_obj, &ts, &ts_none) < 0 || row_int(xid_obj, &xid, &xid_none) < 0 ||
        row_int(elsn_obj, &elsn, &elsn_none) < 0)
        return ST_ERROR;
    if (elsn_none) elsn = pos[0];
    if (put_piece(vb, pieces, 2) < 0) return ST_ERROR;
    if ((ts_none ? buf_put(vb, "null", 4) : put_lld(vb, floordiv(ts, 1000))) < 0) return ST_ERROR;
    if (put_piece(vb, pieces, 3) < 0 || put_lld(vb, pos[0]) < 0 || put_piece(vb, pieces, 4) < 0 ||
        put_lld(vb, elsn) < 0 || put_piece(vb, pieces, 5) < 0)
        return ST_ERROR;
    if ((xid_none ? buf_put(vb, "null", 4) : put_lld(vb, xid)) < 0) return ST_ERROR;
    if (put_piece(vb, pieces, 6) < 0 || put_lld(vb, elsn) < 0 || put_piece(vb, pieces, 7) < 0 ||
        buf_putc(vb, op) < 0 || put_piece(vb, pieces, 8) < 0 || put_lld(vb, now_ms) < 0 || put_piece(vb, pieces, 9) < 0)
        return ST_ERROR;
    return ST_OK;
}

/* render_events(rows, plan_for, pieces, snapshot_pieces, clock) -> (records, fallbacks) | False
 *
 * rows: stored event rows (LocalLog.event_rows: off, lsn, seq, op, key, payload, before,
 * before_kind, sv, xid, ts, elsn). records: (key, value, headers) per event, plus a tombstone
 * (key, None, headers) after each delete; a row Python must render is one None in records,
 * listed in fallbacks as (index in records, index in rows). False: an update has unchanged
 * TOAST values (the run is filled and rendered in Python). plan_for(sv) gives the Plan of a
 * schema version; clock() the ms timestamp, read every 1024 rows as EnvelopeRenderer.records
 * does. */
static PyObject *render_events(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[0]) || check_pieces(args[2]) < 0 || check_pieces(args[3]) < 0) {
        PyErr_SetString(PyExc_TypeError, "render_events(rows: list, plan_for, pieces: tuple[bytes x10], "
                                         "snapshot_pieces: tuple[bytes x10], clock)");
        return NULL;
    }
    PyObject *rows = args[0], *plan_for = args[1], *clock = args[4];
    PyObject *records = PyList_New(0), *fallbacks = PyList_New(0), *plans = PyDict_New(), *result = NULL;
    Buf kb, vb;
    buf_init(&kb);
    buf_init(&vb);
    if (!records || !fallbacks || !plans) goto done;
    PyObject *last_sv = NULL;
    Plan *plan = NULL;
    long long now_ms = 0;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 12) {
            PyErr_SetString(PyExc_TypeError, "render_events: rows must be 12-tuples (LocalLog.event_rows)");
            goto done;
        }
        if ((i & 1023) == 0) {
            PyObject *now = PyObject_CallNoArgs(clock);
            if (now == NULL) goto done;
            now_ms = PyLong_AsLongLong(now);
            Py_DECREF(now);
            if (now_ms == -1 && PyErr_Occurred()) goto done;
        }
        PyObject *sv = PyTuple_GET_ITEM(row, 8);
        if (sv != last_sv) {
            PyObject *p = PyDict_GetItemWithError(plans, sv);
            if (p == NULL) {
                if (PyErr_Occurred()) goto done;
                p = PyObject_CallOneArg(plan_for, sv);
                if (p == NULL) goto done;
                int bad = !PyObject_TypeCheck(p, &PlanType) || PyDict_SetItem(plans, sv, p) < 0;
                Py_DECREF(p); /* the dict holds it */
                if (bad) {
                    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "render_events: plan_for must return a Plan");
                    goto done;
                }
            }
            plan = (Plan *)p;
            last_sv = sv;
        }
        PyObject *op_obj = PyTuple_GET_ITEM(row, 3);
        char op = (PyUnicode_Check(op_obj) && PyUnicode_GET_LENGTH(op_obj) == 1) ? (char)PyUnicode_READ_CHAR(op_obj, 0) : 0;
        long long pos[4];
        if (row_int(PyTuple_GET_ITEM(row, 1), &pos[0], NULL) < 0 || row_int(PyTuple_GET_ITEM(row, 2), &pos[1], NULL) < 0 ||
            row_int(PyTuple_GET_ITEM(row, 10), &pos[2], NULL) < 0 || row_int(sv, &pos[3], NULL) < 0)
            goto done;
        kb.len = vb.len = 0;
        int rc = render_event(plan, op == 'r' ? args[3] : args[2], op, PyTuple_GET_ITEM(row, 5), PyTuple_GET_ITEM(row, 6),
                              pos, PyTuple_GET_ITEM(row, 9), PyTuple_GET_ITEM(row, 10), PyTuple_GET_ITEM(row, 11), now_ms,
                              &kb, &vb);
        if (rc == ST_ERROR) goto done;
        if (rc == ST_UNCHANGED) { result = Py_NewRef(Py_False); goto done; }
        if (rc == ST_FALLBACK) {
            PyObject *where = Py_BuildValue("(nn)", PyList_GET_SIZE(records), i);
            int bad = where == NULL || PyList_Append(fallbacks, where) < 0 || PyList_Append(records, Py_None) < 0;
            Py_XDECREF(where);
            if (bad) goto done;
            continue;
        }
        char hbuf[POSITION_HEADERS_MAX];
        PyObject *key = buf_bytes(&kb), *value = buf_bytes(&vb);
        PyObject *headers = PyBytes_FromStringAndSize(hbuf, write_position_headers(hbuf, pos));
        PyObject *rec = (key && value && headers) ? PyTuple_Pack(3, key, value, headers) : NULL;
        int bad = rec == NULL || PyList_Append(records, rec) < 0;
        Py_XDECREF(rec);
        if (!bad && op == 'd') {
            rec = PyTuple_Pack(3, key, Py_None, headers);
            bad = rec == NULL || PyList_Append(records, rec) < 0;
            Py_XDECREF(rec);
        }
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(headers);
        if (bad) goto done;
    }
    result = PyTuple_Pack(2, records, fallbacks);
done:
    buf_free(&kb);
    buf_free(&vb);
    Py_XDECREF(records);
    Py_XDECREF(fallbacks);
    Py_XDECREF(plans);
    return result;
}

static PyMethodDef module_methods[] = {
    {"encode_batch", (PyCFunction)(void (*)(void))encode_batch, METH_FASTCALL,
     "encode_batch(records, start, limit) -> (bytes, count)"},
    {"position_headers", (PyCFunction)(void (*)(void))position_headers, METH_FASTCALL,
     "position_headers(lsn, seq, commit_ts, schema_version) -> bytes"},
    {"render_events", (PyCFunction)(void (*)(void))render_events, METH_FASTCALL,
     "render_events(rows, plan_for, pieces, snapshot_pieces, clock) -> (records, fallbacks) | False"},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef plan_methods[] = {
    {"render", (PyCFunction)(void (*)(void))plan_render, METH_FASTCALL,
     "render(data, format, flags) -> (key JSON | None, row JSON | None) | None | False"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc._render.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "How to render one table schema's row images (see cdc/log/kafka/fastpath.py).",
    .tp_methods = plan_methods,
    .tp_init = (initproc)plan_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cdc._render", "The Kafka publisher's hot path in C (see cdc/log/kafka/fastpath.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__render(void) {
    if (PyType_Ready(&PlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "TUPLEDATA", F_TUPLEDATA) < 0 || PyModule_AddIntConstant(m, "COPY", F_COPY) < 0 ||
        PyModule_AddIntConstant(m, "WANT_KEY", WANT_KEY) < 0 || PyModule_AddIntConstant(m, "WANT_ROW", WANT_ROW) < 0 ||
        PyModule_AddIntConstant(m, "ALLOW_UNCHANGED", ALLOW_UNCHANGED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
