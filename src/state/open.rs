//! Opening the store and recovering from what can be found in its place: a corrupt, foreign
//! or not-a-regular-file store is moved aside (the agent starts fresh), a newer schema is left
//! alone (the agent runs without a store), an unwritable place is said and gone without. What
//! is there is looked at without following a link or blocking (`place.rs`) and read read-only
//! until it is known to be this agent's: another program's database is never written.

use std::fs;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rusqlite::{Connection, ErrorCode, OpenFlags};

use super::place::{self, By, Found as OnDisk};
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
    /// A symlink, FIFO, device, socket or directory at a store's name, or a file with other
    /// links or of another user: nothing the agent made.
    NotRegular,
    /// An SQLite database without shmlink's `meta` row: another program's.
    NotShmlink,
}

impl Reset {
    pub fn as_str(self) -> &'static str {
        match self {
            Reset::Corrupt => "corrupt",
            Reset::ForeignNode => "foreign_node",
            Reset::NotRegular => "not_regular",
            Reset::NotShmlink => "not_shmlink",
        }
    }

    /// How the log says what was found.
    pub fn said(self) -> &'static str {
        match self {
            Reset::Corrupt => "corrupt",
            Reset::ForeignNode => "another node's",
            Reset::NotRegular => "not a regular file of the agent's",
            Reset::NotShmlink => "a database without shmlink's metadata",
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
    #[error("{path} is {what}, not a store the agent made: not read")]
    NotRegular { path: PathBuf, what: &'static str },
    #[error("the store in {path} did not open within {waited:?} (a slow or hung disk?)")]
    TimedOut {
        path: PathBuf,
        waited: std::time::Duration,
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
    let dir = place::own_dir(dir).map_err(|source| Unavailable::Dir {
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
        Found::Aside(why) => {
            reset = Some((why, move_aside(&path, why)?));
            None
        }
        Found::Error(e) => return Err(sqlite(e)),
    };
    let (conn, boot_changed) = match found {
        Some((_, meta)) if meta.schema_version > SCHEMA_VERSION => {
            return Err(Unavailable::Newer {
                path,
                found: meta.schema_version,
                known: SCHEMA_VERSION,
            })
        }
        Some((conn, meta)) if meta.node != identity.node => {
            drop(conn);
            reset = Some((Reset::ForeignNode, move_aside(&path, Reset::ForeignNode)?));
            (create(&path, identity).map_err(sqlite)?, false)
        }
        Some((conn, meta)) => {
            // Known to be this agent's now: opened for writing.
            drop(conn);
            let conn = connect(&path, OpenFlags::SQLITE_OPEN_READ_WRITE).map_err(sqlite)?;
            let changed = meta.boot_id != identity.boot_id;
            if changed {
                schema::set_boot_id(&conn, &identity.boot_id).map_err(sqlite)?;
            }
            (conn, changed)
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
    /// This agent's store (read-only until then): its meta row.
    Usable(Connection, Meta),
    /// To be moved aside, and why.
    Aside(Reset),
    Error(rusqlite::Error),
}

const HEADER: &[u8; 16] = b"SQLite format 3\0";

/// What is at `path`: nothing (or an empty file), a store that passes `quick_check` and has
/// shmlink's meta row, or something to move aside (not a regular file, not a database, a
/// database without the meta row). It is read through a read-only connection, so a database
/// that is not this agent's is never written (not even a WAL checkpoint). Other errors
/// (permissions, a full disk) are not corruption: nothing moves.
fn inspect(path: &Path) -> Found {
    let mut head = Vec::new();
    match place::look(path, By::Writer) {
        Err(e) => return Found::Error(io_error(e)),
        Ok(OnDisk::Other(what)) => return not_regular(path, what),
        Ok(OnDisk::Absent) => {}
        Ok(OnDisk::File(st)) => match place::read_head(path, &st, 100) {
            Ok(Some(h)) => head = h,
            Ok(None) => return not_regular(path, "a file replaced while it was looked at"),
            Err(e) => return Found::Error(io_error(e)),
        },
    }
    match place::odd_companion(path, By::Writer) {
        Err(e) => return Found::Error(io_error(e)),
        Ok(Some((companion, what))) => return not_regular(&companion, what),
        Ok(None) => {}
    }
    if head.is_empty() {
        return Found::Nothing;
    }
    if head.len() < 100 || &head[..16] != HEADER {
        return Found::Aside(Reset::Corrupt);
    }
    let conn = match connect(path, OpenFlags::SQLITE_OPEN_READ_ONLY) {
        Ok(c) => c,
        Err(e) if is_corrupt(&e) => return Found::Aside(Reset::Corrupt),
        Err(e) => return Found::Error(e),
    };
    let checked = conn
        .query_row("PRAGMA quick_check", [], |r| r.get::<_, String>(0))
        .and_then(|ok| Ok((ok, schema::read_meta(&conn)?)));
    match checked {
        Ok((ok, Some(meta))) if ok == "ok" => Found::Usable(conn, meta),
        Ok((ok, None)) if ok == "ok" => Found::Aside(Reset::NotShmlink),
        Ok(_) => Found::Aside(Reset::Corrupt),
        Err(e) if is_corrupt(&e) => Found::Aside(Reset::Corrupt),
        // A `meta` table of other columns: another program's.
        Err(e) if e.sqlite_error_code() == Some(ErrorCode::Unknown) => {
            Found::Aside(Reset::NotShmlink)
        }
        Err(e) => Found::Error(e),
    }
}

fn not_regular(path: &Path, what: &'static str) -> Found {
    tracing::warn!(path = %path.display(), "{what} where the state store's file goes: moved aside");
    Found::Aside(Reset::NotRegular)
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
/// `SQLITE_OPEN_NOFOLLOW`: no symlink anywhere in the path (DIR is resolved before).
fn connect(path: &Path, flags: OpenFlags) -> rusqlite::Result<Connection> {
    let flags = flags | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_NOFOLLOW;
    let conn = Connection::open_with_flags(path, flags)?;
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

/// A fresh store: the file made 0600 by this call (`O_EXCL`, never through a link) before
/// SQLite opens it (its -wal and -shm files take the same mode), the tables and meta row
/// written. What was at the name is gone by now: nothing, an empty file (removed), or moved
/// aside; so are companions that belong to no database.
fn create(path: &Path, identity: &Identity) -> rusqlite::Result<Connection> {
    if let Ok(OnDisk::File(st)) = place::look(path, By::Writer) {
        if st.st_size == 0 {
            fs::remove_file(path).map_err(io_error)?;
        }
    }
    place::remove_orphans(path);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .and_then(|f| f.set_permissions(fs::Permissions::from_mode(0o600)))
        .map_err(io_error)?;
    let mut conn = connect(path, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
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
    let dir = fs::canonicalize(dir).map_err(|source| Unavailable::Dir {
        path: dir.into(),
        source,
    })?;
    let path = dir.join(FILE);
    let sqlite = |source| Unavailable::Sqlite {
        path: path.clone(),
        source,
    };
    // Looked at first, as `open` does: a link is not followed, a FIFO not waited on.
    let odd = match place::look(&path, By::Reader) {
        Ok(OnDisk::File(_)) => place::odd_companion(&path, By::Reader),
        Ok(OnDisk::Absent) => {
            return Err(Unavailable::Dir {
                path,
                source: std::io::ErrorKind::NotFound.into(),
            })
        }
        Ok(OnDisk::Other(what)) => Ok(Some((path.clone(), what))),
        Err(e) => Err(e),
    };
    match odd {
        Ok(None) => {}
        Ok(Some((path, what))) => return Err(Unavailable::NotRegular { path, what }),
        Err(source) => return Err(Unavailable::Dir { path, source }),
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

/// Renames the store (and its companions) to `state.sqlite3.<reason>-<unix time>`, keeping
/// the newest [`KEEP_ASIDE`] of that reason. Failing to move it is failing to open.
fn move_aside(path: &Path, why: Reset) -> Result<PathBuf, Unavailable> {
    place::set_aside(path, &format!("{}-", why.as_str()), KEEP_ASIDE).map_err(|source| {
        Unavailable::Dir {
            path: path.into(),
            source,
        }
    })
}
