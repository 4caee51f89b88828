/* gw_files.h - OpenAI's Files API (/v1/files) over a directory, the input
 * and output of batch jobs (gw_jobs.h).
 *
 * A file is two entries in the directory (--files-dir): file-ID.json (its
 * metadata: OpenAI's File object, with the API key tag that owns it) and
 * file-ID.data (its bytes). Both are written under a temporary name and
 * renamed, so a crash leaves a whole file or none; the directory may be
 * shared by every gateway of a cluster (a volume), which then all see the
 * same files. Upload is multipart/form-data (file, purpose), as the openai
 * SDK sends it, bounded by --max-body-bytes. A file belongs to the API key
 * that uploaded it: another key gets 404. */
#ifndef GW_FILES_H
#define GW_FILES_H

#include "gw_http.h"

#include <jansson.h>
#include <stddef.h>

/* Makes the directory (and its parents); LLM_EIO with err. */
int gw_files_init(const char *dir, char *err, size_t errlen);
/* /v1/files and /v1/files/{id}[/content] (rest: what follows "/v1/files", "" or "/ID[/content]"). */
void gw_files_handle(const char *dir, gw_http_req *r, const char *tenant, const char *rest);

/* For batch jobs. A file's metadata if it exists and tenant owns it (NULL: any owner), else NULL. */
json_t *gw_file_meta(const char *dir, const char *id, const char *tenant);
/* The path of a file's bytes (dir/file-ID.data) into out. */
void gw_file_data_path(const char *dir, const char *id, char *out, size_t n);
/* Writes the metadata of a file whose bytes are already at gw_file_data_path (renamed into place): it becomes
 * visible. */
int gw_file_publish(const char *dir, const char *id, const char *filename, const char *purpose, const char *tenant);
/* A new id: "file-" and 24 hex digits (prefix: another, e.g. "batch_"). */
void gw_files_new_id(char *out, size_t n, const char *prefix);
/* A multipart/form-data upload: the file part's bytes and name, and purpose's bytes (pointers into b). LLM_EINVAL
 * with err when it is not one, or has no file part. */
typedef struct {
    const char *file, *purpose;
    size_t file_len, purpose_len;
    char filename[256];
} gw_form;
int gw_files_form(const char *ctype, const char *b, size_t len, gw_form *f, char *err, size_t errlen);
/* Writes s to path through a temporary file and a rename (the directory entry is whole or absent). */
int gw_files_write_atomic(const char *path, const char *s, size_t len);

#endif
