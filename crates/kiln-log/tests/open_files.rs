//! The real file system's descriptor bound (`kiln_log::fds`), in a process of its own: the
//! bound and the count are process-wide, so these run one after another in one test.
//!
//! * more files than the bound: at most the bound hold a descriptor, and every file still reads
//!   back what was written through whichever descriptor it had then, and syncs;
//! * a log of many segments (a full log directory) works within a bound of three;
//! * a descriptor in use is not pulled from under an operation;
//! * a file removed while its descriptor was closed is an error naming it;
//! * dropped files give their descriptors back.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use kiln_log::fds::{open_files, set_open_files_max, OPEN_FILES_MAX_DEFAULT};
use kiln_log::fs::{Fs, FsFile, RealFs};

#[test]
fn the_real_file_system_keeps_at_most_its_bound_of_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let fs = RealFs;
    assert_eq!(open_files(), 0);
    set_open_files_max(3);

    let files: Vec<Arc<dyn FsFile>> = (0..10)
        .map(|i| fs.open(&dir.path().join(format!("f{i}")), true).unwrap())
        .collect();
    assert!(open_files() <= 3, "{} open", open_files());
    for (i, f) in files.iter().enumerate() {
        f.write_all_at(&[i as u8; 4], 0).unwrap();
        assert!(open_files() <= 3, "{} open", open_files());
    }
    for (i, f) in files.iter().enumerate().rev() {
        let mut buf = [0u8; 4];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [i as u8; 4]);
        f.sync_now().unwrap();
        assert_eq!(f.len().unwrap(), 4);
    }
    let descriptors = std::fs::read_dir("/proc/self/fd").unwrap().count();
    drop(files);
    assert_eq!(open_files(), 0, "dropped files give their descriptors back");
    let after = std::fs::read_dir("/proc/self/fd").unwrap().count();
    assert!(
        after <= descriptors,
        "{after} descriptors after, {descriptors} before"
    );

    // The async sync goes through a descriptor of its own, reopened if need be.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let a = fs.open(&dir.path().join("a"), true).unwrap();
    let others: Vec<_> = (0..4)
        .map(|i| fs.open(&dir.path().join(format!("b{i}")), true).unwrap())
        .collect();
    a.write_all_at(b"still", 0).unwrap();
    let sync = a.sync();
    let more: Vec<_> = (0..4)
        .map(|i| fs.open(&dir.path().join(format!("c{i}")), true).unwrap())
        .collect();
    runtime.block_on(sync).unwrap();
    let mut buf = [0u8; 5];
    a.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"still");
    drop((a, others, more));

    // A file removed by path while closed cannot be opened again: an error that names it.
    set_open_files_max(1);
    let gone = fs.open(&dir.path().join("gone"), true).unwrap();
    let other = fs.open(&dir.path().join("other"), true).unwrap();
    assert_eq!(open_files(), 1, "`gone` was closed to make room");
    std::fs::remove_file(dir.path().join("gone")).unwrap();
    let e = gone.write_all_at(b"x", 0).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    assert!(e.to_string().contains("gone"), "{e}");
    drop((gone, other));

    // A whole log within a bound of three: segments roll, indexes grow, all read back.
    set_open_files_max(3);
    let (log, _) = open_real(&dir.path().join("log"), small_config());
    for i in 0..200u8 {
        append(&log, 1, &data(1, 4, i));
        assert!(open_files() <= 3, "{} open", open_files());
    }
    runtime.block_on(log.sync()).unwrap();
    assert!(
        log.segments().len() > 3,
        "{} segments",
        log.segments().len()
    );
    let batches = read_all(&log, 64 << 10, i64::MAX);
    assert_eq!(batches.len(), 200);
    for (i, b) in batches.iter().enumerate() {
        assert_eq!(decode_batch(b).len(), 4, "batch {i}");
    }
    assert!(open_files() <= 3, "{} open", open_files());
    drop(log);
    // And after a restart, recovery reads every segment within the bound too.
    let (log, report) = open_real(&dir.path().join("log"), small_config());
    assert_eq!(log.tail().next_index, 200, "{report:?}");
    assert!(open_files() <= 3, "{} open", open_files());
    drop(log);
    set_open_files_max(OPEN_FILES_MAX_DEFAULT);
}
