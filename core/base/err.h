/* The code half of the last error (the text half is kb_errf's). */
#ifndef KB_CORE_ERR_H
#define KB_CORE_ERR_H

/* Record the code kb_last_error_code() returns (err.c): for the calls that
 * return NULL instead of a code. */
void kb__err_set_code(int code);

#endif /* KB_CORE_ERR_H */
