/* cm_error.h - error codes shared by every module.
 *
 * Functions return 0 on success or a negative LLM_E* code; results travel
 * through out-parameters. cm_strerror() names every code. */
#ifndef CM_ERROR_H
#define CM_ERROR_H

enum {
    LLM_OK = 0,
    LLM_EINVAL = -1,   /* bad argument or malformed input */
    LLM_ENOMEM = -2,   /* allocation failed */
    LLM_EIO = -3,      /* read/open/mmap failed (see errno) */
    LLM_EFORMAT = -4,  /* file is not in the expected format or is corrupt */
    LLM_ETRUNC = -5,   /* file or message ends before its declared contents */
    LLM_EUNSUP = -6,   /* valid but unsupported (architecture, tensor type, version) */
    LLM_ENOTFOUND = -7,/* key, tensor or token not present */
    LLM_ERANGE = -8,   /* value outside the allowed range (e.g. prompt too long) */
    LLM_EAGAIN = -9,   /* non-blocking operation would block; try again */
    LLM_EDEVICE = -10, /* accelerator error or no accelerator */
    LLM_ETIMEDOUT = -11,
    LLM_EAUTH = -12,   /* a peer without the shared secret */
};

/* Static string naming an error code; never NULL. */
const char *cm_strerror(int err);

#endif
