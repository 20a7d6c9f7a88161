//! Empty on purpose: the check of nixl-sys's build prerequisites (libclang, a
//! C++ compiler) is the build script of the build-dependency
//! `nixl-prerequisites`, because this script would run only after nixl-sys's
//! (which `links = "nixl"`), too late to say what to install. Build
//! dependencies are built for a package only when it has a build script.

fn main() {}
