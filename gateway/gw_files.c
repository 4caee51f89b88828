#include "gw_files.h"
#include "cm_error.h"
#include "cm_log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int gw_files_init(const char *dir, char *err, size_t errlen) {
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0700) && errno != EEXIST) break;
            *s = '/';
        }
    if (mkdir(p, 0700) && errno != EEXIST) {
        snprintf(err, errlen, "--files-dir %s: %s", dir, strerror(errno));
        return LLM_EIO;
    }
    if (access(p, W_OK | X_OK)) {
        snprintf(err, errlen, "--files-dir %s: not writable: %s", dir, strerror(errno));
        return LLM_EIO;
    }
    return 0;
}

void gw_files_new_id(char *out, size_t n, const char *prefix) {
    unsigned char b[12] = {0};
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        memcpy(b, &t, sizeof b < sizeof t ? sizeof b : sizeof t);
    }
    int o = snprintf(out, n, "%s", prefix);
    for (int i = 0; i < 12 && (size_t)o + 2 < n; i++) o += snprintf(out + o, n - (size_t)o, "%02x", b[i]);
}

/* An id of ours: the prefix, then hex (no path separators, no dots). */
static int good_id(const char *id, const char *prefix) {
    size_t pl = strlen(prefix), n = strlen(id);
    if (strncmp(id, prefix, pl) || n == pl || n > 64) return 0;
    for (size_t i = pl; i < n; i++)
        if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f'))) return 0;
    return 1;
}

int gw_files_write_atomic(const char *path, const char *s, size_t len) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return LLM_EIO;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, s + off, len - off);
        if (w <= 0) {
            close(fd);
            unlink(tmp);
            return LLM_EIO;
        }
        off += (size_t)w;
    }
    if (fsync(fd) || close(fd) || rename(tmp, path)) {
        unlink(tmp);
        return LLM_EIO;
    }
    return 0;
}

static void meta_path(const char *dir, const char *id, char *out, size_t n) { snprintf(out, n, "%s/%s.json", dir, id); }

void gw_file_data_path(const char *dir, const char *id, char *out, size_t n) { snprintf(out, n, "%s/%s.data", dir, id); }

json_t *gw_file_meta(const char *dir, const char *id, const char *tenant) {
    char p[4200];
    if (!good_id(id, "file-")) return NULL;
    meta_path(dir, id, p, sizeof p);
    json_t *m = json_load_file(p, 0, NULL);
    const char *owner = json_string_value(json_object_get(m, "owner"));
    if (!json_is_object(m) || !owner || (tenant && strcmp(owner, tenant))) {
        json_decref(m);
        return NULL;
    }
    return m;
}

int gw_file_publish(const char *dir, const char *id, const char *filename, const char *purpose, const char *tenant) {
    char p[4200];
    struct stat st;
    gw_file_data_path(dir, id, p, sizeof p);
    if (stat(p, &st)) return LLM_EIO;
    json_t *m = json_pack("{s:s,s:s,s:I,s:I,s:s,s:s,s:s,s:s}", "id", id, "object", "file", "bytes", (json_int_t)st.st_size,
                          "created_at", (json_int_t)time(NULL), "filename", filename, "purpose", purpose, "status",
                          "processed", "owner", tenant);
    char *s = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    meta_path(dir, id, p, sizeof p);
    int rc = s ? gw_files_write_atomic(p, s, strlen(s)) : LLM_ENOMEM;
    free(s);
    return rc;
}

/* The File object as the API shows it (without its owner). */
static json_t *shown(json_t *m) {
    json_object_del(m, "owner");
    return m;
}

/* ---- multipart/form-data ------------------------------------------------------------- */

static const char *find(const char *h, size_t hl, const char *n, size_t nl) {
    return nl <= hl ? memmem(h, hl, n, nl) : NULL;
}

/* The value of name="..." style parameter p in a header line [s, e), into out. */
static int param(const char *s, const char *e, const char *p, char *out, size_t n) {
    size_t pl = strlen(p);
    for (const char *x = s; x + pl + 2 <= e; x++)
        if (!strncasecmp(x, p, pl) && x[pl] == '=' && (x == s || x[-1] == ' ' || x[-1] == ';')) {
            const char *v = x + pl + 1, *ve;
            if (*v == '"') {
                v++;
                ve = memchr(v, '"', (size_t)(e - v));
            } else {
                ve = v;
                while (ve < e && *ve != ';' && *ve != ' ' && *ve != '\r') ve++;
            }
            if (!ve || (size_t)(ve - v) >= n) return 0;
            memcpy(out, v, (size_t)(ve - v));
            out[ve - v] = 0;
            return 1;
        }
    return 0;
}

int gw_files_form(const char *ctype, const char *b, size_t len, gw_form *f, char *err, size_t errlen) {
    char bound[200] = "--";
    memset(f, 0, sizeof *f);
    if (!ctype || strncasecmp(ctype, "multipart/form-data", 19) ||
        !param(ctype, ctype + strlen(ctype), "boundary", bound + 2, sizeof bound - 2)) {
        snprintf(err, errlen, "a file is uploaded as multipart/form-data (fields file and purpose)");
        return LLM_EINVAL;
    }
    size_t bl = strlen(bound);
    const char *p = find(b, len, bound, bl), *end = b + len;
    while (p && (size_t)(end - p) >= bl + 2) {
        p += bl;
        if (p[0] == '-' && p[1] == '-') break; /* the closing boundary */
        if (p[0] != '\r' || p[1] != '\n') break;
        p += 2;
        const char *hend = find(p, (size_t)(end - p), "\r\n\r\n", 4);
        if (!hend) break;
        char name[64] = "", fname[256] = "";
        for (const char *l = p; l < hend;) { /* header lines */
            const char *le = find(l, (size_t)(hend - l), "\r\n", 2);
            le = le ? le : hend;
            if (le - l > 20 && !strncasecmp(l, "Content-Disposition:", 20)) {
                param(l, le, "name", name, sizeof name);
                param(l, le, "filename", fname, sizeof fname);
            }
            l = le + 2;
        }
        const char *body = hend + 4, *next = find(body, (size_t)(end - body), bound, bl);
        if (!next || next - body < 2) break;
        size_t n = (size_t)(next - body) - 2; /* less the CRLF before the boundary */
        if (!strcmp(name, "file")) {
            f->file = body;
            f->file_len = n;
            snprintf(f->filename, sizeof f->filename, "%s", fname[0] ? fname : "upload.jsonl");
        } else if (!strcmp(name, "purpose")) {
            f->purpose = body;
            f->purpose_len = n;
        }
        p = next;
    }
    if (!f->file) {
        snprintf(err, errlen, "file: Field required (a multipart/form-data part named file)");
        return LLM_EINVAL;
    }
    return 0;
}

/* ---- the endpoints ----------------------------------------------------------------------- */

static void upload(const char *dir, gw_http_req *r, const char *tenant) {
    gw_form f;
    char err[300], id[64], path[4200], purpose[32] = "";
    if (gw_files_form(r->content_type, r->body, r->body_len, &f, err, sizeof err)) {
        gw_http_error(r->conn, 400, err, "file", "invalid_request_error");
        return;
    }
    if (f.purpose && f.purpose_len < sizeof purpose) memcpy(purpose, f.purpose, f.purpose_len), purpose[f.purpose_len] = 0;
    if (strcmp(purpose, "batch") && strcmp(purpose, "user_data")) {
        gw_http_error(r->conn, 400, "purpose: 'batch' or 'user_data' (the files this server uses)", "purpose", "invalid_value");
        return;
    }
    gw_files_new_id(id, sizeof id, "file-");
    gw_file_data_path(dir, id, path, sizeof path);
    if (gw_files_write_atomic(path, f.file, f.file_len) || gw_file_publish(dir, id, f.filename, purpose, tenant)) {
        CM_WARN("files: cannot write %s: %s", path, strerror(errno));
        gw_http_error(r->conn, 500, "the file could not be stored", NULL, "internal_error");
        return;
    }
    json_t *m = gw_file_meta(dir, id, tenant);
    gw_http_json(r->conn, 200, shown(m));
    json_decref(m);
}

static void list(const char *dir, gw_http_req *r, const char *tenant) {
    DIR *d = opendir(dir);
    json_t *data = json_array();
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".json") || strncmp(e->d_name, "file-", 5)) continue;
        char id[80];
        snprintf(id, sizeof id, "%.*s", (int)(n - 5), e->d_name);
        json_t *m = gw_file_meta(dir, id, tenant);
        if (m) json_array_append_new(data, shown(m));
    }
    if (d) closedir(d);
    json_t *j = json_pack("{s:s,s:o,s:b}", "object", "list", "data", data, "has_more", 0);
    gw_http_json(r->conn, 200, j);
    json_decref(j);
}

static void content(const char *dir, gw_http_req *r, const char *id) {
    char p[4200];
    gw_file_data_path(dir, id, p, sizeof p);
    FILE *f = fopen(p, "rb");
    char *buf = NULL;
    long n = -1;
    if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) && (buf = malloc((size_t)n + 1)) &&
        fread(buf, 1, (size_t)n, f) == (size_t)n)
        gw_http_body(r->conn, 200, "application/jsonl", buf, (size_t)n);
    else
        gw_http_error(r->conn, 500, "the file could not be read", NULL, "internal_error");
    if (f) fclose(f);
    free(buf);
}

void gw_files_handle(const char *dir, gw_http_req *r, const char *tenant, const char *rest) {
    if (!*rest) {
        if (r->method == GW_M_POST) upload(dir, r, tenant);
        else if (r->method == GW_M_GET || r->method == GW_M_HEAD) list(dir, r, tenant);
        else gw_http_method_not_allowed(r->conn, "GET, HEAD, POST");
        return;
    }
    char id[80];
    const char *slash = strchr(rest + 1, '/');
    size_t il = slash ? (size_t)(slash - rest - 1) : strlen(rest + 1);
    int want_content = slash && !strcmp(slash, "/content");
    if (*rest != '/' || il >= sizeof id || (slash && !want_content)) {
        gw_http_error(r->conn, 404, "no such endpoint", NULL, "not_found");
        return;
    }
    memcpy(id, rest + 1, il);
    id[il] = 0;
    json_t *m = gw_file_meta(dir, id, tenant);
    char msg[200];
    if (!m) {
        snprintf(msg, sizeof msg, "No such File object: %.80s", id);
        gw_http_error(r->conn, 404, msg, "id", "not_found");
        return;
    }
    if (want_content) {
        if (r->method != GW_M_GET && r->method != GW_M_HEAD) gw_http_method_not_allowed(r->conn, "GET, HEAD");
        else content(dir, r, id);
    } else if (r->method == GW_M_GET || r->method == GW_M_HEAD) {
        gw_http_json(r->conn, 200, shown(m));
    } else if (r->method == GW_M_DELETE) {
        char p[4200];
        meta_path(dir, id, p, sizeof p);
        unlink(p); /* the metadata first: a half-deleted file is no longer seen */
        gw_file_data_path(dir, id, p, sizeof p);
        unlink(p);
        json_t *d = json_pack("{s:s,s:s,s:b}", "id", id, "object", "file", "deleted", 1);
        gw_http_json(r->conn, 200, d);
        json_decref(d);
    } else {
        gw_http_method_not_allowed(r->conn, "GET, HEAD, DELETE");
    }
    json_decref(m);
}
