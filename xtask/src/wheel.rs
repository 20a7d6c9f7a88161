//! Python wheels (zip files) that pip downloaded: find one, unpack part of it.

use std::fs::File;
use std::path::{Path, PathBuf};

/// The newest wheel in `dir` whose file name starts with `prefix`
/// (`nixl_cu12-1.5.1-`: the version, then the build and platform tags).
pub(crate) fn find(dir: &Path, prefix: &str) -> Result<PathBuf, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("read {}: {e}", dir.display()))?;
    let mut wheels: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".whl"))
        })
        .collect();
    wheels.sort();
    wheels
        .pop()
        .ok_or_else(|| format!("no {prefix}*.whl in {}", dir.display()))
}

/// Unpacks the members of `wheel` whose names `keep` accepts under `dest`,
/// with their Unix modes; returns how many files it wrote. A member whose
/// name would land outside `dest` is an error.
pub(crate) fn extract(
    wheel: &Path,
    dest: &Path,
    keep: impl Fn(&str) -> bool,
) -> Result<usize, String> {
    let fail = |e: &dyn std::fmt::Display| format!("unpack {}: {e}", wheel.display());
    let file = File::open(wheel).map_err(|e| fail(&e))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| fail(&e))?;
    let mut written = 0;
    for i in 0..zip.len() {
        let mut member = zip.by_index(i).map_err(|e| fail(&e))?;
        if !keep(member.name()) {
            continue;
        }
        let relative = member
            .enclosed_name()
            .ok_or_else(|| fail(&format!("unsafe member name {:?}", member.name())))?;
        let path = dest.join(relative);
        if member.is_dir() {
            std::fs::create_dir_all(&path).map_err(|e| fail(&e))?;
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| fail(&e))?;
        }
        let mut out = File::create(&path).map_err(|e| fail(&e))?;
        std::io::copy(&mut member, &mut out).map_err(|e| fail(&e))?;
        if let Some(mode) = member.unix_mode() {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::Permissions::from_mode(mode & 0o777);
            std::fs::set_permissions(&path, mode).map_err(|e| fail(&e))?;
        }
        written += 1;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use zip::write::SimpleFileOptions;

    use super::*;

    #[test]
    fn extracts_only_the_kept_members_with_their_bytes_and_modes() {
        let dir = std::env::temp_dir().join(format!("xtask-wheel-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let wheel = dir.join("demo-1.0-py3-none-any.whl");
        let mut zip = zip::ZipWriter::new(File::create(&wheel).unwrap());
        for (name, bytes, mode) in [
            ("lib/libx.so", b"ELF".as_slice(), 0o755),
            ("lib/sub/data.txt", b"data".as_slice(), 0o644),
            ("other/skip.txt", b"no".as_slice(), 0o644),
        ] {
            let options = SimpleFileOptions::default().unix_permissions(mode);
            zip.start_file(name, options).unwrap();
            zip.write_all(bytes).unwrap();
        }
        zip.finish().unwrap();

        assert_eq!(find(&dir, "demo-1.0-").unwrap(), wheel);
        assert!(find(&dir, "demo-2.0-").is_err());
        let out = dir.join("out");
        let written = extract(&wheel, &out, |n| n.starts_with("lib/")).unwrap();

        assert_eq!(written, 2);
        assert_eq!(std::fs::read(out.join("lib/libx.so")).unwrap(), b"ELF");
        assert_eq!(
            std::fs::read(out.join("lib/sub/data.txt")).unwrap(),
            b"data"
        );
        assert!(!out.join("other").exists());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(out.join("lib/libx.so"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
