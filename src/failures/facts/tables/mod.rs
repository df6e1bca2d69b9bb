//! The toolkits' own tables (generated once by `scripts/facts_tables.py`, each file naming its
//! source): CUDA's and HIP's errors, Linux's errno; and what each CUDA/HIP error means for the
//! GPU path ([`class`]), the one hand-written part.

mod cuda;
mod errno;
mod hip;

use std::collections::HashMap;
use std::sync::LazyLock;

use crate::model::GpuApi;

/// One entry: a number, its name, the words the library prints for it (empty: an alias whose
/// words are its number's first entry's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code {
    pub code: u32,
    pub name: &'static str,
    pub text: &'static str,
}

/// A GPU error a line reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuError {
    pub api: GpuApi,
    pub code: u32,
    pub name: &'static str,
}

/// Every name of every table, looked up whole (a name is a word: its identifier is read and
/// looked up once, whatever the tables' size).
static NAMES: LazyLock<HashMap<&'static str, (GpuApi, &'static Code)>> = LazyLock::new(|| {
    let mut names = HashMap::new();
    for (api, table) in [
        (GpuApi::Cuda, cuda::RUNTIME),
        (GpuApi::Cuda, cuda::DRIVER),
        (GpuApi::Hip, hip::HIP),
    ] {
        for c in table {
            names.entry(c.name).or_insert((api, c));
            // CUDAdrv.jl prints the driver's names without `CUDA_`.
            if let Some(short) = c.name.strip_prefix("CUDA_") {
                names.entry(short).or_insert((api, c));
            }
        }
    }
    names
});

/// The GPU error whose name `s` starts with (`cudaErrorPeerAccessUnsupported`,
/// `CUDA_ERROR_NVLINK_UNCORRECTABLE`, `ERROR_ECC_UNCORRECTABLE` as CUDAdrv.jl prints it,
/// `hipErrorPeerAccessUnsupported`), a whole word, and its length.
pub fn gpu_by_name(s: &str) -> Option<(GpuError, usize)> {
    let word = identifier(s);
    let (api, c) = NAMES.get(word)?;
    Some((gpu(*api, c), word.len()))
}

/// The identifier `s` starts with (letters, digits, `_`).
fn identifier(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The GPU error whose words `s` starts with, and their length: the longest words of the
/// report's API's table ("device not ready" is not "not ready"), else of the other's (HIP copies
/// CUDA's words).
pub fn gpu_by_text(s: &str, api: GpuApi) -> Option<(GpuError, usize)> {
    let longest = |table: &'static [Code]| {
        table
            .iter()
            .filter(|c| !c.text.is_empty() && s.starts_with(c.text))
            .max_by_key(|c| c.text.len())
    };
    let (first, second) = match api {
        GpuApi::Cuda => ((GpuApi::Cuda, cuda::RUNTIME), (GpuApi::Hip, hip::HIP)),
        GpuApi::Hip => ((GpuApi::Hip, hip::HIP), (GpuApi::Cuda, cuda::RUNTIME)),
    };
    [first, second]
        .into_iter()
        .find_map(|(api, table)| longest(table).map(|c| (gpu(api, c), c.text.len())))
}

/// A GPU error by its number alone (a line that prints no words or name): today's numbering.
pub fn gpu_by_code(api: GpuApi, code: u32) -> Option<GpuError> {
    let table = match api {
        GpuApi::Cuda => cuda::RUNTIME,
        GpuApi::Hip => hip::HIP,
    };
    table.iter().find(|c| c.code == code).map(|c| gpu(api, c))
}

fn gpu(api: GpuApi, c: &Code) -> GpuError {
    GpuError {
        api,
        code: c.code,
        name: c.name,
    }
}

/// An errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno {
    pub number: u32,
    pub name: &'static str,
}

/// The errno whose strerror text `s` starts with (glibc's, or Go's lower-case one), and the
/// text's length.
pub fn errno_by_text(s: &str) -> Option<(Errno, usize)> {
    let first_upper = |t: &str| {
        let mut c = s.chars();
        c.next()
            .is_some_and(|c0| t.starts_with(c0.to_ascii_uppercase()))
            && s.get(1..).is_some_and(|rest| rest.starts_with(&t[1..]))
    };
    errno::ERRNO
        .iter()
        .filter(|c| s.starts_with(c.text) || first_upper(c.text))
        .max_by_key(|c| c.text.len())
        .map(|c| (errno_of(c), c.text.len()))
}

/// The errno named `s` starts with (`ENOSPC`), a whole word, and its length.
pub fn errno_by_name(s: &str) -> Option<(Errno, usize)> {
    static BY_NAME: LazyLock<HashMap<&'static str, &'static Code>> =
        LazyLock::new(|| errno::ERRNO.iter().map(|c| (c.name, c)).collect());
    let word = identifier(s);
    BY_NAME.get(word).map(|c| (errno_of(c), word.len()))
}

/// Every errno, in the number's order.
pub fn errno_table() -> &'static [Code] {
    errno::ERRNO
}

/// The errno numbered `n`.
pub fn errno_by_number(n: u32) -> Option<Errno> {
    errno::ERRNO.iter().find(|c| c.code == n).map(errno_of)
}

fn errno_of(c: &Code) -> Errno {
    Errno {
        number: c.code,
        name: c.name,
    }
}

/// What a CUDA or HIP error means for the GPU path. HIP numbers its errors as CUDA does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuClass {
    /// 217: peer access between the two devices is not supported.
    PeerUnsupported,
    /// 711: more peer mappings than the driver allows.
    TooManyPeers,
    /// 214: uncorrectable ECC error.
    Ecc,
    /// 220: uncorrectable NVLink error.
    Nvlink,
    /// 802: the system (the NVSwitch fabric) is not initialized.
    FabricNotReady,
    /// 205: mapping memory failed.
    MapFailed,
    /// 101: a device this process does not have.
    InvalidDevice,
    /// Nothing of the GPU path: the GPU's own memory, the program's kernels, its build, the
    /// driver's install, a benign answer (704: peer access already enabled), a shutdown.
    NotOurs,
    /// Any other error: the path's when a path call or transport failed with it.
    Other,
}

/// The class of a CUDA/HIP error number.
pub fn class(code: u32) -> GpuClass {
    match code {
        217 => GpuClass::PeerUnsupported,
        711 => GpuClass::TooManyPeers,
        214 => GpuClass::Ecc,
        220 => GpuClass::Nvlink,
        802 => GpuClass::FabricNotReady,
        205 => GpuClass::MapFailed,
        101 => GpuClass::InvalidDevice,
        // Out of memory; the driver missing, too old, a stub, no device, shutting down; a
        // build without code for the GPU (JIT, images, functions); the program's own kernels
        // and launches (700-721 but the peer ones), graph capture; peer access already on.
        2
        | 4
        | 34
        | 35
        | 36
        | 100
        | 98
        | 200
        | 209
        | 218
        | 221..=225
        | 300..=303
        | 700..=703
        | 704
        | 710
        | 714..=721
        | 900..=910
        | 1052
        | 1053 => GpuClass::NotOurs,
        _ => GpuClass::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_are_the_toolkits_own() {
        // Spot checks against CUDA's documentation of cudaError_t and CUresult.
        let by = |n| gpu_by_code(GpuApi::Cuda, n).unwrap().name;
        assert_eq!(by(217), "cudaErrorPeerAccessUnsupported");
        assert_eq!(by(220), "cudaErrorNvlinkUncorrectable");
        assert_eq!(by(711), "cudaErrorTooManyPeers");
        assert_eq!(
            gpu_by_code(GpuApi::Hip, 217).unwrap().name,
            "hipErrorPeerAccessUnsupported"
        );
        assert!(cuda::RUNTIME.len() > 120 && cuda::DRIVER.len() > 90 && hip::HIP.len() > 70);
        assert_eq!(errno_by_number(28).unwrap().name, "ENOSPC");
        assert_eq!(errno_by_number(38).unwrap().name, "ENOSYS");
        // Every number's names and words are unique per table, so a lookup is never a guess.
        for table in [cuda::RUNTIME, cuda::DRIVER, errno::ERRNO] {
            let mut names: Vec<_> = table.iter().map(|c| c.name).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), table.len());
        }
    }

    #[test]
    fn names_are_read_whole_in_every_spelling() {
        let name = |s| gpu_by_name(s).map(|(e, n)| (e.api, e.code, n));
        assert_eq!(
            name("cudaErrorPeerAccessUnsupported: x"),
            Some((GpuApi::Cuda, 217, 30))
        );
        assert_eq!(
            name("CUDA_ERROR_NVLINK_UNCORRECTABLE: uncorrectable"),
            Some((GpuApi::Cuda, 220, 31))
        );
        assert_eq!(
            name("ERROR_ECC_UNCORRECTABLE)"),
            Some((GpuApi::Cuda, 214, 23))
        );
        assert_eq!(
            name("hipErrorPeerAccessUnsupported"),
            Some((GpuApi::Hip, 217, 29))
        );
        // A longer word that only starts like a name is none.
        assert_eq!(name("cudaErrorNotReadyX"), None);
        assert_eq!(name("cudaErrorX"), None);
    }

    #[test]
    fn words_and_errnos_are_read_by_their_text() {
        let (e, n) = gpu_by_text(
            "peer access is not supported between these two devices'",
            GpuApi::Cuda,
        )
        .unwrap();
        assert_eq!((e.code, n), (217, 54));
        // The longest words win: "device not ready" is not "not ready".
        assert_eq!(
            gpu_by_text("invalid device ordinal", GpuApi::Hip)
                .unwrap()
                .0
                .code,
            101
        );
        assert_eq!(
            errno_by_text("No space left on device: '/dev/shm/x'")
                .unwrap()
                .0
                .number,
            28
        );
        assert_eq!(
            errno_by_text("no space left on device").unwrap().0.number,
            28
        );
        assert_eq!(errno_by_name("ENOSPC)").unwrap().0.number, 28);
        assert_eq!(errno_by_name("ENOSPCX"), None);
    }

    #[test]
    fn classes_name_the_path_and_leave_the_rest() {
        assert_eq!(class(220), GpuClass::Nvlink);
        assert_eq!(class(2), GpuClass::NotOurs);
        assert_eq!(class(700), GpuClass::NotOurs);
        assert_eq!(class(704), GpuClass::NotOurs);
        assert_eq!(class(1), GpuClass::Other);
        assert_eq!(class(400), GpuClass::Other);
    }
}
