// LeakSanitizer's suppression of OpenSSL 3 objects that gRPC leaves behind
// when the process exits while its event engine's detached threads still
// hold a TLS handshake or session (grpc/grpc#38539: "Occasional memory leak",
// reported against gRPC built with OpenSSL 3, as Debian's is). The test
// binaries that are TLS clients in process include this header once, in
// their one source file: a test that finishes with a handshake still in
// flight (a refused peer's channel) is otherwise reported as leaking a few
// SSL objects at exit, one run in ten. moesh never calls libcrypto itself
// (certificates are made by the openssl CLI), so every object allocated
// inside it belongs to gRPC's TLS.
#ifndef MOESH_TESTS_SECURITY_LSAN_GRPC_OPENSSL_H_
#define MOESH_TESTS_SECURITY_LSAN_GRPC_OPENSSL_H_

// Read by LeakSanitizer at exit in sanitizer builds; never called otherwise.
extern "C" const char* __lsan_default_suppressions() { return "leak:libcrypto.so\n"; }

#endif  // MOESH_TESTS_SECURITY_LSAN_GRPC_OPENSSL_H_
