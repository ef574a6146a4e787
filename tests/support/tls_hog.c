/* Loaded by test_dlopen before libkeybus.so, in sizes from 1 KiB down to 8
 * bytes until glibc's static TLS room for dlopen'ed libraries is used up, as
 * libraries loaded earlier in a long-lived process use it. A libkeybus.so
 * that needed initial-exec TLS would then fail to load. */
__attribute__((tls_model("initial-exec"))) __thread char kb_tls_hog[KB_HOG_BYTES];

char *kb_tls_hog_touch(void)
{
    kb_tls_hog[0] = 1;
    return kb_tls_hog;
}
