//! Discovery: walks kubelet's and Docker's trees below the roots and lists each container
//! directory's log files, never through a symlink.
//!
//! Below a root every directory and file is opened relative to its parent with `O_NOFOLLOW`, so
//! no symlink planted under a root is followed and nothing outside the roots is read (a root
//! that is itself a symlink is the admin's choice).

use std::ffi::{CStr, CString};
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::logs::path::{self, LogFile};
use crate::model::ContainerRef;

use super::dirs::ContainerDir;
use super::handle::Listed;
use super::notify::Watched;
use super::stream::Format;
use super::{file_id, mtime, size, Follower};

/// A root, opened where the admin says, symlink or not.
pub(super) fn root_dir(root: &Path) -> rustix::io::Result<Dir> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    rustix::fs::open(root, flags, Mode::empty()).and_then(Dir::new)
}

impl Follower {
    /// `<root>/<ns>_<pod>_<uid>/<container>/<files>`.
    pub(super) fn walk_pods(&mut self, root: &Path) {
        let Some(mut root_dir) = self.open_root(root) else {
            return;
        };
        self.still.note(0, "", &root_dir);
        self.watch(root, Watched::Tree);
        for (pod_name, pod_type) in self.list(&mut root_dir, root) {
            let Some(pod_str) = pod_name
                .to_str()
                .ok()
                .filter(|n| path::pod_dir(n).is_some())
            else {
                continue;
            };
            let pod_path = root.join(pod_str);
            let Some(mut pod_dir) = self.open_dir(&root_dir, &pod_name, pod_type, &pod_path) else {
                continue;
            };
            self.still.note(0, pod_str, &pod_dir);
            self.watch(&pod_path, Watched::Tree);
            for (ctr_name, ctr_type) in self.list(&mut pod_dir, &pod_path) {
                let Some((ctr_str, origin)) = ctr_name
                    .to_str()
                    .ok()
                    .and_then(|c| Some((c, path::pod_origin(pod_str, c)?)))
                else {
                    continue;
                };
                let ctr_path = pod_path.join(ctr_str);
                let Some(mut ctr_dir) = self.open_dir(&pod_dir, &ctr_name, ctr_type, &ctr_path)
                else {
                    continue;
                };
                let key = (0, format!("{pod_str}/{ctr_str}"));
                self.still.note(0, &key.1, &ctr_dir);
                self.watch(&ctr_path, Watched::Container(key.clone()));
                let dir = ContainerDir::new(origin, Format::Cri);
                self.scan_dir(key, dir, &mut ctr_dir, &ctr_path, &path::pod_file);
            }
        }
    }

    /// `<root>/containers/<id>/<files>`.
    pub(super) fn walk_docker(&mut self, root: &Path) {
        let Some(root_dir) = self.open_root(root) else {
            return;
        };
        self.still.note(1, "", &root_dir); // `containers` may be made later
        self.watch(root, Watched::Tree);
        let containers = root.join("containers");
        let Some(mut containers_dir) =
            self.open_dir(&root_dir, c"containers", FileType::Unknown, &containers)
        else {
            return;
        };
        self.still.note(1, "containers", &containers_dir);
        self.watch(&containers, Watched::Tree);
        for (id_name, id_type) in self.list(&mut containers_dir, &containers) {
            let Some(id) = id_name.to_str().ok().filter(|n| path::docker_id(n)) else {
                continue;
            };
            let id_path = containers.join(id);
            let Some(mut id_dir) = self.open_dir(&containers_dir, &id_name, id_type, &id_path)
            else {
                continue;
            };
            let key = (1, id.to_string());
            self.still.note(1, &format!("containers/{id}"), &id_dir);
            self.watch(&id_path, Watched::Container(key.clone()));
            let dir = ContainerDir::new(ContainerRef::by_id(id, None), Format::Docker);
            self.scan_dir(key, dir, &mut id_dir, &id_path, &|name| {
                path::docker_file(id, name)
            });
        }
    }

    /// Watches a directory before it is listed, so that nothing made after the listing is
    /// missed.
    /// A directory not watched is counted once as an error.
    fn watch(&mut self, path: &Path, what: Watched) {
        if let Some(n) = self.notify.as_mut() {
            if !n.watch(path, what) {
                self.tally.remember_failed(path);
            }
        }
    }

    /// A root is where the admin says, symlink or not; a missing one means no logs.
    fn open_root(&mut self, root: &Path) -> Option<Dir> {
        match root_dir(root) {
            Ok(dir) => Some(dir),
            Err(e) => {
                self.still.distrust(); // it may appear
                self.tally.fail(root, &e.into());
                None
            }
        }
    }

    /// A directory below a root, never through a symlink: `O_NOFOLLOW` refuses the last
    /// component, and every earlier one was opened the same way.
    fn open_dir(
        &mut self,
        parent: &Dir,
        name: &CStr,
        file_type: FileType,
        path: &Path,
    ) -> Option<Dir> {
        if !matches!(file_type, FileType::Directory | FileType::Unknown) {
            return None; // symlinks included
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let opened = parent
            .fd()
            .and_then(|parent| rustix::fs::openat(parent, name, flags, Mode::empty()))
            .and_then(Dir::new);
        match opened {
            Ok(dir) => Some(dir),
            // A symlink (ELOOP), something else (ENOTDIR): not ours to read.
            Err(Errno::LOOP | Errno::NOTDIR) => None,
            Err(e) => {
                self.tally.fail(path, &e.into());
                None
            }
        }
    }

    /// A directory's entries (not `.` and `..`) with their types as getdents reports them.
    fn list(&mut self, dir: &mut Dir, path: &Path) -> Vec<(CString, FileType)> {
        let mut out = Vec::new();
        for entry in dir {
            match entry {
                Ok(entry) => {
                    let name = entry.file_name();
                    if name != c"." && name != c".." {
                        out.push((name.to_owned(), entry.file_type()));
                    }
                }
                Err(e) => {
                    self.tally.fail(path, &e.into());
                    break;
                }
            }
        }
        out
    }

    /// Lists one container directory's log files and updates its state (`dir` is its state if
    /// it is new).
    fn scan_dir(
        &mut self,
        key: (u8, String),
        dir: ContainerDir,
        fd: &mut Dir,
        dir_path: &Path,
        parse: &dyn Fn(&str) -> Option<LogFile<'_>>,
    ) {
        let mut files = Vec::new();
        for (name, file_type) in self.list(fd, dir_path) {
            let Some((name_str, file)) = name.to_str().ok().and_then(|n| Some((n, parse(n)?)))
            else {
                continue;
            };
            if !matches!(file_type, FileType::RegularFile | FileType::Unknown) {
                continue; // symlinks included
            }
            let path = dir_path.join(name_str);
            let stat = fd
                .fd()
                .and_then(|fd| rustix::fs::statat(fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW));
            let st = match stat {
                Ok(st) => st,
                Err(e) => {
                    self.tally.fail(&path, &e.into());
                    continue;
                }
            };
            if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
                continue;
            }
            files.push(Listed {
                live: file.live.to_string(),
                rotation: file.rotation,
                name,
                path,
                id: file_id(&st),
                mtime: mtime(&st),
                size: size(&st),
            });
        }
        let Ok(fd) = fd.fd() else {
            return;
        };
        let state = self.dirs.entry(key).or_insert(dir);
        state.seen = true;
        state.update(files, fd, &self.start, &mut self.tally);
    }
}
