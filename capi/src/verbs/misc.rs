//! The string functions, sysfs helpers and fork control.
//! (Safety argument: the parent module's.)

use super::*;

/// A static NUL-terminated copy of each name, made once.
fn c_name(
    table: &'static OnceLock<Vec<std::ffi::CString>>,
    names: fn() -> Vec<String>,
    i: usize,
) -> *const c_char {
    let t = table.get_or_init(|| {
        names()
            .into_iter()
            .map(|s| std::ffi::CString::new(s).unwrap_or_default())
            .collect()
    });
    t.get(i).map_or(c"unknown".as_ptr(), |s| s.as_ptr())
}

/// `ibv_wc_status_str`.
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: sys::ibv_wc_status) -> *const c_char {
    static T: OnceLock<Vec<std::ffi::CString>> = OnceLock::new();
    c_name(
        &T,
        || {
            (0..32)
                .map(|v| WcStatus::try_from(v).map_or("unknown".into(), |s| s.to_string()))
                .collect()
        },
        status as usize,
    )
}

/// `ibv_event_type_str`.
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: sys::ibv_event_type) -> *const c_char {
    static T: OnceLock<Vec<std::ffi::CString>> = OnceLock::new();
    c_name(
        &T,
        || {
            (0..32)
                .map(|v| AsyncEventType::try_from(v).map_or("unknown".into(), |s| s.to_string()))
                .collect()
        },
        event as usize,
    )
}

/// `ibv_port_state_str`.
#[no_mangle]
pub extern "C" fn ibv_port_state_str(state: sys::ibv_port_state) -> *const c_char {
    static T: OnceLock<Vec<std::ffi::CString>> = OnceLock::new();
    c_name(
        &T,
        || {
            (0..8)
                .map(|v| PortState::try_from(v).map_or("unknown".into(), |s| s.to_string()))
                .collect()
        },
        state as usize,
    )
}

/// `ibv_node_type_str`.
#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: sys::ibv_node_type) -> *const c_char {
    static T: OnceLock<Vec<std::ffi::CString>> = OnceLock::new();
    let i = usize::try_from(node_type.wrapping_add(1)).unwrap_or(0);
    c_name(
        &T,
        || {
            (-1..8)
                .map(|v: i32| {
                    verbs_api::NodeType::try_from(v as u32)
                        .map_or("unknown".into(), |s| s.to_string())
                })
                .collect()
        },
        i,
    )
}

/// `ibv_get_sysfs_path`.
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `ibv_read_sysfs_file`: reads `dir/file` (without its trailing newline) into
/// `buf`; the length, or -1. Emulated devices have no sysfs entries, so for them it
/// fails, as for a missing attribute.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        return -1;
    }
    // SAFETY: NUL-terminated strings from the caller.
    let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
    let path = std::path::Path::new(&*d.to_string_lossy()).join(&*f.to_string_lossy());
    let Ok(mut data) = std::fs::read(path) else {
        return -1;
    };
    if data.last() == Some(&b'\n') {
        data.pop();
    }
    let n = data.len().min(size - 1);
    // SAFETY: the caller's buffer has `size` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr().cast(), buf, n);
        *buf.add(n) = 0;
    }
    n as c_int
}

/// `ibv_fork_init`: nothing to do (no pages are pinned).
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`.
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_uint {
    sys::IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range`: nothing is pinned, so nothing to do.
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range`.
#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_query_qp_data_in_order`: 0, what libibverbs returns for a provider without the
/// query (rdma-core verbs.c): the program may not assume that the bytes of a message
/// land in order before its completion.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut sys::ibv_qp,
    _op: sys::ibv_wr_opcode,
    _flags: u32,
) -> c_int {
    0
}
