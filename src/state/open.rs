//! Opening the store and recovering from what can be found in its place: a corrupt or foreign
//! file is moved aside (the agent starts fresh), a newer schema is left alone (the agent runs
//! without a store), an unwritable place is said and gone without.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, ErrorCode, OpenFlags};

use super::schema::{self, Meta, SCHEMA_VERSION};
use super::Identity;

pub const FILE: &str = "state.sqlite3";
/// Moved-aside stores kept per reason; older ones are deleted.
pub const KEEP_ASIDE: usize = 3;

/// Why the store was moved aside and begun afresh (the `reason` label of
/// `shmlink_state_resets_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reset {
    Corrupt,
    ForeignNode,
}

impl Reset {
    pub fn as_str(self) -> &'static str {
        match self {
            Reset::Corrupt => "corrupt",
            Reset::ForeignNode => "foreign_node",
        }
    }
}

/// Why the agent runs without a store.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error("the store {path} was written by a newer shmlink (schema {found}, this one knows {known}); it is left as it is")]
    Newer {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error("the state directory {path} cannot be used: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the store {path} cannot be opened or written: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
}

/// A store opened read-write, and what was found there.
pub struct Opened {
    pub conn: Connection,
    pub path: PathBuf,
    /// The last boot ID differs: kernel-log positions from the store are not to be trusted.
    pub boot_changed: bool,
    /// Set when what was there was moved aside (and where to).
    pub reset: Option<(Reset, PathBuf)>,
}

/// Opens (creating) `dir/state.sqlite3` for `identity`.
pub fn open(dir: &Path, identity: &Identity) -> Result<Opened, Unavailable> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| Unavailable::Dir {
            path: dir.into(),
            source,
        })?;
    let path = dir.join(FILE);
    let sqlite = |source| Unavailable::Sqlite {
        path: path.clone(),
        source,
    };
    let mut reset = None;
    let found = match inspect(&path) {
        Found::Usable(conn, meta) => Some((conn, meta)),
        Found::Nothing => None,
        Found::Corrupt => {
            reset = Some((Reset::Corrupt, move_aside(&path, Reset::Corrupt)?));
            None
        }
        Found::Error(e) => return Err(sqlite(e)),
    };
    let (conn, boot_changed) = match found {
        Some((_, Some(meta))) if meta.schema_version > SCHEMA_VERSION => {
            return Err(Unavailable::Newer {
                path,
                found: meta.schema_version,
                known: SCHEMA_VERSION,
            })
        }
        Some((_, Some(meta))) if meta.node != identity.node => {
            reset = Some((Reset::ForeignNode, move_aside(&path, Reset::ForeignNode)?));
            (create(&path, identity).map_err(sqlite)?, false)
        }
        Some((conn, Some(meta))) => {
            let changed = meta.boot_id != identity.boot_id;
            if changed {
                schema::set_boot_id(&conn, &identity.boot_id).map_err(sqlite)?;
            }
            (conn, changed)
        }
        // A file that never finished its creation holds nothing worth keeping.
        Some((conn, None)) => {
            drop(conn);
            (create(&path, identity).map_err(sqlite)?, false)
        }
        None => (create(&path, identity).map_err(sqlite)?, false),
    };
    Ok(Opened {
        conn,
        path,
        boot_changed,
        reset,
    })
}

enum Found {
    Nothing,
    Usable(Connection, Option<Meta>),
    Corrupt,
    Error(rusqlite::Error),
}

const HEADER: &[u8; 16] = b"SQLite format 3\0";

/// What is at `path`: nothing (or an empty file), a store that passes `quick_check`, or one
/// that does not. Other errors (permissions, a full disk) are not corruption: nothing moves.
fn inspect(path: &Path) -> Found {
    let mut head = Vec::with_capacity(100);
    match fs::File::open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Found::Nothing,
        Err(e) => return Found::Error(io_error(e)),
        Ok(f) => {
            if let Err(e) = f.take(100).read_to_end(&mut head) {
                return Found::Error(io_error(e));
            }
        }
    }
    if head.is_empty() {
        return Found::Nothing;
    }
    if head.len() < 100 || &head[..16] != HEADER {
        return Found::Corrupt;
    }
    let conn = match connect(path, OpenFlags::SQLITE_OPEN_READ_WRITE) {
        Ok(c) => c,
        Err(e) if is_corrupt(&e) => return Found::Corrupt,
        Err(e) => return Found::Error(e),
    };
    let checked = conn
        .query_row("PRAGMA quick_check", [], |r| r.get::<_, String>(0))
        .and_then(|ok| Ok((ok, schema::read_meta(&conn)?)));
    match checked {
        Ok((ok, meta)) if ok == "ok" => Found::Usable(conn, meta),
        Ok(_) => Found::Corrupt,
        Err(e) if is_corrupt(&e) => Found::Corrupt,
        Err(e) => Found::Error(e),
    }
}

fn io_error(e: std::io::Error) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
        Some(e.to_string()),
    )
}

fn is_corrupt(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase)
    )
}

/// A connection in the store's modes. WAL: a reader (`history`, the HTTP endpoint) never waits
/// for the writer nor the writer for it. `synchronous=NORMAL`: in WAL mode commits are not
/// fsync'd one by one, only at checkpoints, so a power loss can lose the last commits but never
/// corrupts the file; a process crash loses nothing committed.
fn connect(path: &Path, flags: OpenFlags) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(path, flags | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    conn.busy_timeout(std::time::Duration::from_secs(2))?;
    Ok(conn)
}

fn set_modes(conn: &Connection) -> rusqlite::Result<()> {
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(mode, "the state store could not enter WAL mode");
    }
    conn.pragma_update(None, "synchronous", "NORMAL")
}

/// A fresh store: the file made 0600 before SQLite opens it (its -wal and -shm files take the
/// same mode), the tables and meta row written.
fn create(path: &Path, identity: &Identity) -> rusqlite::Result<Connection> {
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|f| f.set_permissions(fs::Permissions::from_mode(0o600)))
        .map_err(io_error)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
    let mut conn = connect(path, flags)?;
    set_modes(&conn)?;
    let created_ms = crate::model::unix_ms(SystemTime::now());
    schema::create(
        &mut conn,
        &Meta {
            schema_version: SCHEMA_VERSION,
            node: identity.node.clone(),
            created_ms,
            boot_id: identity.boot_id.clone(),
        },
    )?;
    Ok(conn)
}

/// Opens an existing store read-only for `history` and the HTTP endpoint: never creates, never
/// migrates; refuses a newer schema.
pub fn open_read_only(dir: &Path) -> Result<Connection, Unavailable> {
    let path = dir.join(FILE);
    let sqlite = |source| Unavailable::Sqlite {
        path: path.clone(),
        source,
    };
    if let Err(source) = fs::metadata(&path) {
        return Err(Unavailable::Dir { path, source });
    }
    let cannot_open = |e: &rusqlite::Error| e.sqlite_error_code() == Some(ErrorCode::CannotOpen);
    let read = |conn: Connection| schema::read_meta(&conn).map(|m| (conn, m));
    // No -wal: no writer has it open and every row is in the main file. SQLite would still
    // create the -wal and -shm (read-write, as root) to read it, so `check` and `history`
    // read it as immutable and leave the directory as they found it.
    let mut wal = path.clone().into_os_string();
    wal.push("-wal");
    if fs::symlink_metadata(&wal).is_err() {
        let (conn, meta) = immutable(&path).and_then(read).map_err(sqlite)?;
        return checked(conn, meta, path);
    }
    let (conn, meta) = match connect(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).and_then(read) {
        Ok(found) => found,
        // A WAL store on a read-only filesystem, closed (no -shm left), cannot make its -shm:
        // nothing can write there either, so it is read as immutable.
        Err(e) if cannot_open(&e) => immutable(&path).and_then(read).map_err(sqlite)?,
        Err(e) => return Err(sqlite(e)),
    };
    checked(conn, meta, path)
}

/// The store's connection, unless its schema is newer than this binary's or it has none.
fn checked(conn: Connection, meta: Option<Meta>, path: PathBuf) -> Result<Connection, Unavailable> {
    match meta {
        Some(m) if m.schema_version > SCHEMA_VERSION => Err(Unavailable::Newer {
            path,
            found: m.schema_version,
            known: SCHEMA_VERSION,
        }),
        Some(_) => Ok(conn),
        None => Err(Unavailable::Sqlite {
            path,
            source: rusqlite::Error::QueryReturnedNoRows,
        }),
    }
}

fn immutable(path: &Path) -> rusqlite::Result<Connection> {
    let mut uri = String::from("file:");
    for c in path.to_string_lossy().chars() {
        match c {
            '?' => uri.push_str("%3f"),
            '#' => uri.push_str("%23"),
            '%' => uri.push_str("%25"),
            c => uri.push(c),
        }
    }
    uri.push_str("?immutable=1");
    connect(
        Path::new(&uri),
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
    )
}

/// Renames the store (and its -wal and -shm) to `state.sqlite3.<reason>-<unix time>`, keeping
/// the newest [`KEEP_ASIDE`] of that reason. Failing to move it is failing to open.
fn move_aside(path: &Path, why: Reset) -> Result<PathBuf, Unavailable> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let prefix = format!("{FILE}.{}-", why.as_str());
    let aside = path.with_file_name(format!("{prefix}{now}"));
    fs::rename(path, &aside).map_err(|source| Unavailable::Dir {
        path: path.into(),
        source,
    })?;
    for suffix in ["-wal", "-shm"] {
        let from = PathBuf::from(format!("{}{suffix}", path.display()));
        let _ = fs::rename(&from, format!("{}{suffix}", aside.display()));
    }
    if let Some(dir) = path.parent() {
        prune_aside(dir, &prefix);
    }
    Ok(aside)
}

fn prune_aside(dir: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut stamps: Vec<u64> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_prefix(prefix)?.parse().ok())
        .collect();
    stamps.sort_unstable();
    stamps.dedup();
    let excess = stamps.len().saturating_sub(KEEP_ASIDE);
    for stamp in &stamps[..excess] {
        for suffix in ["", "-wal", "-shm"] {
            let _ = fs::remove_file(dir.join(format!("{prefix}{stamp}{suffix}")));
        }
    }
}
