use std::path::{Path, PathBuf};

use rstest::rstest;

use crate::check::{is_libclang, libclang_path_problem};

/// A fresh folder under the system's temporary one holding empty `files`.
fn folder_with(test: &str, files: &[&str]) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("nixl-prerequisites-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in files {
        std::fs::write(dir.join(f), b"").unwrap();
    }
    dir
}

#[rstest]
#[case::unversioned("libclang.so", true)]
#[case::soname("libclang.so.18", true)]
#[case::full_version("libclang.so.18.1.3", true)]
#[case::debian_versioned("libclang-18.so", true)]
#[case::debian_versioned_soname("libclang-18.so.18", true)]
#[case::cpp_library_is_not_libclang("libclang-cpp.so.18", false)]
#[case::static_archive_is_not_shared("libclang.a", false)]
#[case::other_library("libLLVM-18.so", false)]
fn a_shared_libclang_is_named_as_clang_sys_searches(#[case] name: &str, #[case] is: bool) {
    assert_eq!(is_libclang(name), is);
}

#[test]
fn a_folder_holding_libclang_passes() {
    let dir = folder_with("holds", &["libclang-18.so.18", "libLLVM-18.so"]);
    assert_eq!(libclang_path_problem(&dir), None);
}

#[test]
fn the_library_file_itself_passes() {
    let dir = folder_with("file", &["libclang.so.18"]);
    assert_eq!(libclang_path_problem(&dir.join("libclang.so.18")), None);
}

#[test]
fn a_folder_without_libclang_is_named_in_the_message() {
    let dir = folder_with("without", &["libclang-cpp.so.18", "libclang.a"]);
    let problem = libclang_path_problem(&dir).unwrap();
    assert_eq!(
        problem,
        format!(
            "libclang (nixl-sys generates its bindings with bindgen): LIBCLANG_PATH={} \
             holds no libclang.so* or libclang-*.so*",
            dir.display()
        )
    );
}

#[test]
fn a_file_that_is_not_libclang_is_named_in_the_message() {
    let dir = folder_with("not-libclang", &["libclang-cpp.so.18"]);
    let problem = libclang_path_problem(&dir.join("libclang-cpp.so.18")).unwrap();
    assert!(
        problem.ends_with("libclang-cpp.so.18 is not a libclang.so* or libclang-*.so*"),
        "{problem}"
    );
}

#[test]
fn a_path_that_does_not_exist_says_so() {
    let problem = libclang_path_problem(Path::new("/nonexistent/llvm/lib")).unwrap();
    assert!(
        problem.ends_with("LIBCLANG_PATH=/nonexistent/llvm/lib does not exist"),
        "{problem}"
    );
}
