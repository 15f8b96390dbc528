//! The inode record as stored: one format byte, then the postcard encoding of [`Inode`].

use serde::{Deserialize, Serialize};
use stria_proto::fs::{FileLayout, Ino, LayoutPolicy};

use crate::error::{MetaError, Result};
use crate::types::{Attr, EXTENSION_BYTES_MAX, FileKind, SIZE_CLASS_BOUNDS, Timestamp};

/// Version of the inode record encoding; bump it with a decoder for the old one.
pub const RECORD_FORMAT: u8 = 1;

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Inode {
    pub kind: FileKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub rdev: u32,
    /// Directories: the parent (root: itself). Others: the directory of the first link or the
    /// last rename, used to pick a layout policy at spill time.
    pub parent: Ino,
    /// The top-level directory (child of root) this inode counts against; root's files count
    /// against the root itself.
    pub fileset: Ino,
    /// Bumped by every change to a file's data; guards `spill_commit`.
    pub version: u64,
    /// Lower-case extension of the name, "" if none (regular files only).
    pub ext: String,
    pub body: Body,
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Body {
    /// Fifos, sockets, devices.
    Special,
    File(FileData),
    Dir(DirBody),
    Symlink(Vec<u8>),
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum FileData {
    Inline(Vec<u8>),
    Chunked(FileLayout),
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct DirBody {
    /// Sequence number the next entry gets; readdir cookies are built from it.
    pub next_seq: u64,
    pub policy: LayoutPolicy,
}

/// The first sequence number of a directory's entries. Cookies 0, 1 and 2 all mean "from
/// the start", so a caller may use 1 and 2 for `.` and `..`.
pub const FIRST_SEQ: u64 = 3;

impl Inode {
    pub fn encode(&self) -> Result<Vec<u8>> {
        postcard::to_extend(self, vec![RECORD_FORMAT])
            .map_err(|e| MetaError::Corrupt(format!("encode inode: {e}")))
    }

    pub fn decode(ino: Ino, bytes: &[u8]) -> Result<Inode> {
        match bytes.split_first() {
            Some((&RECORD_FORMAT, rest)) => postcard::from_bytes(rest)
                .map_err(|e| MetaError::Corrupt(format!("inode {ino}: {e}"))),
            Some((format, _)) => {
                Err(MetaError::Corrupt(format!("inode {ino}: unknown record format {format}")))
            }
            None => Err(MetaError::Corrupt(format!("inode {ino}: empty record"))),
        }
    }

    pub fn attr(&self, ino: Ino) -> Attr {
        Attr {
            ino,
            kind: self.kind,
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            nlink: self.nlink,
            size: self.size,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            rdev: self.rdev,
            layout: self.layout().cloned(),
        }
    }

    pub fn is_dir(&self) -> bool {
        self.kind == FileKind::Dir
    }

    /// Whether the counters include this inode: regular files that still have a name.
    pub fn counted(&self) -> bool {
        self.kind == FileKind::File && self.nlink > 0
    }

    pub fn dir_body(&mut self) -> Option<&mut DirBody> {
        match &mut self.body {
            Body::Dir(d) => Some(d),
            _ => None,
        }
    }

    pub fn layout(&self) -> Option<&FileLayout> {
        match &self.body {
            Body::File(FileData::Chunked(l)) => Some(l),
            _ => None,
        }
    }
}

/// The histogram class of a file of `size` bytes.
pub fn size_class(size: u64) -> u64 {
    SIZE_CLASS_BOUNDS.iter().position(|&bound| size < bound).unwrap_or(SIZE_CLASS_BOUNDS.len())
        as u64
}

/// The extension counted for `name`: the part after the last dot, lower-cased, when it is
/// short and alphanumeric and the name does not start with that dot.
pub fn extension_of(name: &[u8]) -> String {
    let Some(dot) = name.iter().rposition(|&b| b == b'.') else {
        return String::new();
    };
    let ext = &name[dot + 1..];
    if dot == 0
        || ext.is_empty()
        || ext.len() > EXTENSION_BYTES_MAX
        || !ext.iter().all(|b| b.is_ascii_alphanumeric())
    {
        return String::new();
    }
    ext.iter().map(|b| b.to_ascii_lowercase() as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_and_classes() {
        assert_eq!(extension_of(b"a.TXT"), "txt");
        assert_eq!(extension_of(b".bashrc"), "");
        assert_eq!(extension_of(b"noext"), "");
        assert_eq!(extension_of(b"a.tar.gz"), "gz");
        assert_eq!(extension_of(b"a.b-c"), "");
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(4095), 0);
        assert_eq!(size_class(4096), 1);
        assert_eq!(size_class(64 << 20), 4);
    }

    #[test]
    fn small_file_record_is_compact() {
        let rec = Inode {
            kind: FileKind::File,
            mode: 0o644,
            uid: 1000,
            gid: 1000,
            nlink: 1,
            size: 0,
            atime: Timestamp::new(1_700_000_000, 123_456_789),
            mtime: Timestamp::new(1_700_000_000, 123_456_789),
            ctime: Timestamp::new(1_700_000_000, 123_456_789),
            rdev: 0,
            parent: 12345,
            fileset: 12,
            version: 0,
            ext: "txt".into(),
            body: Body::File(FileData::Inline(Vec::new())),
        };
        let bytes = rec.encode().expect("encode");
        assert!(bytes.len() <= 64, "record is {} bytes", bytes.len());
        assert_eq!(Inode::decode(7, &bytes).expect("decode"), rec);
        assert!(Inode::decode(7, &[9, 1, 2]).is_err());
    }
}
