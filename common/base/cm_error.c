#include "cm_error.h"

const char *cm_strerror(int err) {
    switch (err) {
    case LLM_OK: return "success";
    case LLM_EINVAL: return "invalid argument";
    case LLM_ENOMEM: return "out of memory";
    case LLM_EIO: return "I/O error";
    case LLM_EFORMAT: return "bad file format";
    case LLM_ETRUNC: return "truncated input";
    case LLM_EUNSUP: return "unsupported";
    case LLM_ENOTFOUND: return "not found";
    case LLM_ERANGE: return "out of range";
    case LLM_EAGAIN: return "try again";
    case LLM_EDEVICE: return "device error";
    case LLM_ETIMEDOUT: return "timed out";
    case LLM_EAUTH: return "not authenticated";
    default: return "unknown error";
    }
}
