/* cm_model_open.c - the format dispatcher: a directory is a Hugging Face
 * checkpoint (cm_hf.c), a file is GGUF or llama2.c (cm_model_gguf.c). */
#include "cm_model.h"

#include <sys/stat.h>

int cm_model_open(const char *path, cm_model_file **out, char *err, size_t errlen) {
    *out = NULL;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return cm_hf_open(path, out, err, errlen);
    return cm_model_open_file(path, out, err, errlen);
}
