//! The node's Ed25519 identity, persisted in the data directory.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use libp2p::identity::Keypair;

/// Load the keypair at `path`, or create one (mode 0600) when the file does not exist.
pub fn load_or_create(path: &Path) -> Result<Keypair, String> {
    match fs::read(path) {
        Ok(bytes) => Keypair::from_protobuf_encoding(&bytes)
            .map_err(|e| format!("cannot decode the key in {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => regenerate(path),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Write a fresh keypair to `path`, replacing any previous one atomically.
pub fn regenerate(path: &Path) -> Result<Keypair, String> {
    let key = Keypair::generate_ed25519();
    let bytes = key.to_protobuf_encoding().map_err(|e| e.to_string())?;
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    // Write beside the target, fsync, rename, fsync the directory: a crash or power loss
    // leaves the old key or the new one, never a half-written key or a forgotten rename.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })?;
    Ok(key)
}
