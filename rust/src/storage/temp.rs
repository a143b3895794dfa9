//! Temporary files beside a target: their names (`.{name}.{pid}.{nanos}.tmp`) and the
//! removal of those that a killed writer left.
use std::fs;
use std::path::{Path, PathBuf};

/// Temporary files that an export killed before it could clean up (its process is gone)
/// are removed by the next export to the same path.
pub(crate) fn remove_stale_temps(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let prefix = format!(".{}.", name.to_string_lossy());
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        // `.{file}.{pid}.{nanos}.tmp`, where {file} is the model's name or that of a file
        // beside it (`{name}.{token}.data`): the pid is read from the end.
        let Some(rest) = file.strip_prefix(&prefix).and_then(|r| r.strip_suffix(".tmp")) else { continue };
        let Some((head, nanos)) = rest.rsplit_once('.') else { continue };
        let pid_text = head.rsplit('.').next().unwrap_or("");
        let (Ok(pid), Ok(_)) = (pid_text.parse::<u32>(), nanos.parse::<u128>()) else { continue };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() && Path::new("/proc/self").exists()
        {
            let _ = fs::remove_file(e.path());
        }
    }
}

pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let unique = format!(".{name}.{}.{}.tmp", std::process::id(), nanos());
    path.with_file_name(unique)
}

pub(crate) fn nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}
