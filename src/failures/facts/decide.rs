//! The one table: a line's facts -> the failure they name. What failed (a GPU error's class,
//! an errno, shared memory said to run short) against where (a GPU path call or transport,
//! /dev/shm). Everything the table does not name is nothing: a GPU error of the job's own
//! memory or kernels, an errno about another file, a fault without its cause.

use super::gpu::Path;
use super::tables::{class, GpuClass};
use super::Facts;
use crate::model::FindingKind;

/// Where the facts happened, as far as the table cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    /// NVLink SHARP multicast: NCCL's `transport/nvls.cc` or a `cuMulticast*` call.
    Multicast,
    /// A CUDA/HIP IPC call (another process's memory).
    Ipc,
    /// NCCL's p2p transport (IPC and peer access together), or a program whose file is about
    /// P2P (`simpleP2P.cu`).
    P2p,
    /// A peer access call (`cudaDeviceEnablePeerAccess`, `cudaMemcpyPeer`).
    Peer,
    /// /dev/shm: a path, a POSIX name or call; `create`: the line makes it.
    Shm {
        create: bool,
    },
    Nowhere,
}

/// What failed, as the table reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    Gpu(GpuClass),
    /// An errno, by the class the table knows (other numbers are [`What::Nothing`]).
    NoSpace,
    NoEntry,
    /// No /dev/shm to use: EROFS, ENOSYS.
    Unusable,
    /// EACCES: no /dev/shm to use when the line makes an object there; opening another's
    /// object (PostgreSQL's segment of another server) is not ours.
    Denied,
    NoFiles,
    /// Words that say shared memory ran short, on a line that also names /dev/shm, a POSIX
    /// shared-memory name or call, or SIGBUS.
    Short,
    Nothing,
}

/// THE table.
pub fn kind(what: What, on: On) -> Option<FindingKind> {
    use FindingKind::*;
    Some(match (what, on) {
        // A GPU error whose name is its cause, wherever it was met.
        (What::Gpu(GpuClass::Nvlink), _) => GpuNvlinkError,
        (What::Gpu(GpuClass::Ecc), _) => GpuEccUncorrectable,
        (What::Gpu(GpuClass::FabricNotReady), _) => GpuFabricNotReady,
        (What::Gpu(GpuClass::TooManyPeers), _) => GpuTooManyPeers,
        (What::Gpu(GpuClass::PeerUnsupported), _) => GpuPeerAccessRefused,
        (What::Gpu(GpuClass::NotOurs), _) => return None,
        // Any other GPU error, by where it was met.
        (What::Gpu(_), On::Multicast) => NvlsMulticastFailed,
        (What::Gpu(GpuClass::MapFailed), On::Ipc | On::P2p | On::Peer) => GpuPeerMappingFailed,
        (What::Gpu(GpuClass::InvalidDevice), On::Ipc | On::P2p) => CudaIpcInvalidDevice,
        // A wrong device number on a peer call is the program's.
        (What::Gpu(GpuClass::InvalidDevice), On::Peer) => return None,
        (What::Gpu(_), On::Ipc | On::P2p | On::Peer) => GpuP2pFailed,
        // /dev/shm by its errno.
        (What::NoSpace | What::Short, On::Shm { .. }) => ShmAllocationFailed,
        (What::Unusable, On::Shm { .. })
        | (What::Denied | What::NoEntry, On::Shm { create: true }) => ShmUnavailable,
        (What::NoEntry, On::Shm { create: false }) => ShmNotShared,
        (What::NoFiles, On::Shm { .. }) => FdLimitReached,
        _ => return None,
    })
}

/// What failed and where, read from the facts.
pub fn what_and_on(f: &Facts<'_>) -> (What, On) {
    if let Some((e, _)) = &f.gpu_error {
        let on = match (f.call.map(|(p, _)| p), f.transport()) {
            (Some(Path::OwnMemory), _) => On::Nowhere,
            (Some(Path::Multicast), _) | (_, Some(super::speaker::Transport::Nvls)) => {
                On::Multicast
            }
            (Some(Path::Ipc), _) => On::Ipc,
            (_, Some(super::speaker::Transport::P2p)) => On::P2p,
            (Some(Path::Peer), _) => On::Peer,
            _ if f.p2p_file => On::P2p,
            _ => On::Nowhere,
        };
        return (What::Gpu(class(e.code)), on);
    }
    let on = f
        .shm
        .as_ref()
        .map_or(On::Nowhere, |o| On::Shm { create: o.create });
    if let Some((e, _)) = &f.errno {
        let what = match e.name {
            "ENOSPC" => What::NoSpace,
            "ENOENT" => What::NoEntry,
            "EROFS" | "ENOSYS" => What::Unusable,
            "EACCES" => What::Denied,
            "EMFILE" | "ENFILE" => What::NoFiles,
            _ => What::Nothing,
        };
        return (what, on);
    }
    if f.shortage.is_some() {
        // The words alone may be about SysV or PostgreSQL's main segment: only with /dev/shm
        // named, a bus error (a mapping of a full tmpfs) or a DataLoader (whose workers pass
        // their batches through /dev/shm).
        let on = match on {
            On::Nowhere if f.sigbus.is_some() || f.dataloader => On::Shm { create: false },
            on => on,
        };
        return (What::Short, on);
    }
    (What::Nothing, On::Nowhere)
}

#[cfg(test)]
mod tests {
    use super::*;
    use FindingKind::*;

    #[test]
    fn the_table() {
        let shm = On::Shm { create: false };
        for (what, on, want) in [
            (
                What::Gpu(GpuClass::Nvlink),
                On::Nowhere,
                Some(GpuNvlinkError),
            ),
            (
                What::Gpu(GpuClass::PeerUnsupported),
                On::Ipc,
                Some(GpuPeerAccessRefused),
            ),
            (What::Gpu(GpuClass::NotOurs), On::P2p, None),
            (
                What::Gpu(GpuClass::Other),
                On::Multicast,
                Some(NvlsMulticastFailed),
            ),
            (
                What::Gpu(GpuClass::MapFailed),
                On::Peer,
                Some(GpuPeerMappingFailed),
            ),
            (What::Gpu(GpuClass::MapFailed), On::Nowhere, None),
            (
                What::Gpu(GpuClass::InvalidDevice),
                On::P2p,
                Some(CudaIpcInvalidDevice),
            ),
            (What::Gpu(GpuClass::InvalidDevice), On::Peer, None),
            (What::Gpu(GpuClass::InvalidDevice), On::Nowhere, None),
            (What::Gpu(GpuClass::Other), On::Ipc, Some(GpuP2pFailed)),
            (What::Gpu(GpuClass::Other), On::Nowhere, None),
            (What::Gpu(GpuClass::Other), shm, None),
            (What::NoSpace, shm, Some(ShmAllocationFailed)),
            (What::NoSpace, On::Nowhere, None),
            (What::NoEntry, shm, Some(ShmNotShared)),
            (
                What::NoEntry,
                On::Shm { create: true },
                Some(ShmUnavailable),
            ),
            (What::Unusable, shm, Some(ShmUnavailable)),
            (What::Denied, shm, None),
            (What::Denied, On::Shm { create: true }, Some(ShmUnavailable)),
            (What::NoFiles, shm, Some(FdLimitReached)),
            (What::Short, shm, Some(ShmAllocationFailed)),
            (What::Short, On::Nowhere, None),
            (What::Nothing, shm, None),
        ] {
            assert_eq!(kind(what, on), want, "{what:?} on {on:?}");
        }
    }
}
