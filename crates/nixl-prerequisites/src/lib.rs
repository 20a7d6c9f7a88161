//! A build-time check, and nothing to call: backend-nixl's build-dependency,
//! whose build script stops the build with what to install when libclang or a
//! C++ compiler is missing (nixl-sys generates its bindings with bindgen and
//! compiles C++ stubs).
//!
//! backend-nixl's own build script cannot do this: nixl-sys declares
//! `links = "nixl"`, so cargo runs nixl-sys's build script, which panics on a
//! missing libclang, before backend-nixl's. A build-dependency of backend-nixl
//! has no such edge: it is compiled and run while nixl-sys's build script (and
//! bindgen under it) is still being compiled, and its failure stops cargo from
//! starting nixl-sys's.
//!
//! Set `BACKEND_NIXL_SKIP_PREREQUISITE_CHECK=1` to skip the check.
#[cfg(test)]
#[allow(dead_code)]
mod check;

#[cfg(test)]
mod tests;
