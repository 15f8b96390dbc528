//! A small blocking NBD client: fixed-newstyle handshake, `NBD_OPT_GO`, then READ, WRITE and
//! FLUSH with simple replies, one request at a time.
//!
//! It exists so Stria's own tools (`stria bench --nbd`) can drive any NBD server, ours or
//! another, without an outside library. It has no TLS and no structured replies; a server
//! that requires TLS answers `NBD_REP_ERR_TLS_REQD`, reported as such.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};

use crate::wire::{
    CMD_DISC, CMD_FLUSH, CMD_READ, CMD_WRITE, FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES,
    FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES, FLAG_READ_ONLY, IHAVEOPT, INFO_EXPORT, NBD_MAGIC, OPT_GO,
    OPTION_REPLY_MAGIC, REP_ACK, REP_ERR, REP_ERR_TLS_REQD, REP_ERR_UNKNOWN, REP_INFO,
    REQUEST_BYTES_MAX, REQUEST_MAGIC, SIMPLE_REPLY_MAGIC, STRING_BYTES_MAX,
};

/// Where an export is: `nbd://HOST[:PORT]/EXPORT` (port 10809 when left out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUri {
    /// `host:port`, ready for `ToSocketAddrs`.
    pub address: String,
    pub export: String,
}

impl NbdUri {
    pub fn parse(text: &str) -> Result<NbdUri, String> {
        let rest = text
            .strip_prefix("nbd://")
            .ok_or_else(|| format!("{text:?} is not an NBD URI: it must start with nbd://"))?;
        let (authority, export) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.is_empty() {
            return Err(format!("{text:?} names no host"));
        }
        // A bracketed IPv6 literal keeps its colons; a port follows the closing bracket.
        let has_port = match authority.rfind(']') {
            Some(end) => authority[end..].contains(':'),
            None => authority.contains(':'),
        };
        let address = if has_port { authority.to_string() } else { format!("{authority}:10809") };
        Ok(NbdUri { address, export: export.to_string() })
    }
}

impl std::fmt::Display for NbdUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "nbd://{}/{}", self.address, self.export)
    }
}

/// One connection in transmission.
#[derive(Debug)]
pub struct NbdClient {
    stream: TcpStream,
    size: u64,
    read_only: bool,
    next_handle: u64,
}

fn protocol(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

fn read_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

impl NbdClient {
    /// Connects and negotiates the export with `NBD_OPT_GO`.
    pub fn connect(uri: &NbdUri) -> io::Result<NbdClient> {
        let addr = uri
            .address
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| protocol(format!("{} resolves to no address", uri.address)))?;
        let mut stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        if read_u64(&mut stream)? != NBD_MAGIC || read_u64(&mut stream)? != IHAVEOPT {
            return Err(protocol(format!("{addr} is not a newstyle NBD server")));
        }
        let server_flags = read_u16(&mut stream)?;
        if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(protocol(format!("{addr} does not speak fixed newstyle")));
        }
        let no_zeroes = server_flags & FLAG_NO_ZEROES != 0;
        let mut client_flags = FLAG_C_FIXED_NEWSTYLE;
        if no_zeroes {
            client_flags |= FLAG_C_NO_ZEROES;
        }
        stream.write_all(&client_flags.to_be_bytes())?;

        let name = uri.export.as_bytes();
        if name.len() > STRING_BYTES_MAX {
            return Err(protocol("the export name is too long"));
        }
        let mut option = Vec::with_capacity(16 + 6 + name.len());
        option.extend_from_slice(&IHAVEOPT.to_be_bytes());
        option.extend_from_slice(&OPT_GO.to_be_bytes());
        option.extend_from_slice(&(4 + name.len() as u32 + 2).to_be_bytes());
        option.extend_from_slice(&(name.len() as u32).to_be_bytes());
        option.extend_from_slice(name);
        option.extend_from_slice(&0u16.to_be_bytes());
        stream.write_all(&option)?;

        let mut export: Option<(u64, u16)> = None;
        loop {
            if read_u64(&mut stream)? != OPTION_REPLY_MAGIC {
                return Err(protocol("bad option reply magic"));
            }
            let _option = read_u32(&mut stream)?;
            let kind = read_u32(&mut stream)?;
            let len = read_u32(&mut stream)?;
            if len > 64 * 1024 {
                return Err(protocol(format!("option reply of {len} bytes")));
            }
            let mut data = vec![0u8; len as usize];
            stream.read_exact(&mut data)?;
            match kind {
                REP_ACK => break,
                REP_INFO if data.len() >= 2 => {
                    let info = u16::from_be_bytes([data[0], data[1]]);
                    if info == INFO_EXPORT && data.len() == 12 {
                        let size = u64::from_be_bytes(data[2..10].try_into().unwrap_or([0; 8]));
                        let flags = u16::from_be_bytes([data[10], data[11]]);
                        export = Some((size, flags));
                    }
                }
                REP_INFO => return Err(protocol("short NBD_REP_INFO")),
                k if k & REP_ERR != 0 => {
                    let text = String::from_utf8_lossy(&data).into_owned();
                    let what = match k {
                        REP_ERR_UNKNOWN => "no such export, or this client may not use it",
                        REP_ERR_TLS_REQD => "the server requires TLS, which this client lacks",
                        _ => "the server refused the export",
                    };
                    let detail = if text.is_empty() { String::new() } else { format!(": {text}") };
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("{uri}: {what}{detail}"),
                    ));
                }
                _ => {}
            }
        }
        let (size, flags) =
            export.ok_or_else(|| protocol("the server sent no NBD_INFO_EXPORT before its ACK"))?;
        Ok(NbdClient { stream, size, read_only: flags & FLAG_READ_ONLY != 0, next_handle: 1 })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    fn send(&mut self, command: u16, offset: u64, len: u32, payload: &[u8]) -> io::Result<u64> {
        let handle = self.next_handle;
        self.next_handle += 1;
        let mut header = [0u8; 28];
        header[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        header[6..8].copy_from_slice(&command.to_be_bytes());
        header[8..16].copy_from_slice(&handle.to_be_bytes());
        header[16..24].copy_from_slice(&offset.to_be_bytes());
        header[24..28].copy_from_slice(&len.to_be_bytes());
        self.stream.write_all(&header)?;
        self.stream.write_all(payload)?;
        Ok(handle)
    }

    fn reply(&mut self, handle: u64, what: &str, offset: u64) -> io::Result<()> {
        if read_u32(&mut self.stream)? != SIMPLE_REPLY_MAGIC {
            return Err(protocol("bad reply magic (structured replies are not negotiated)"));
        }
        let error = read_u32(&mut self.stream)?;
        if read_u64(&mut self.stream)? != handle {
            return Err(protocol("a reply for another request"));
        }
        if error != 0 {
            return Err(io::Error::other(format!(
                "the server failed the {what} at offset {offset}: NBD error {error}"
            )));
        }
        Ok(())
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<u32> {
        let end = offset.checked_add(len as u64);
        if len > REQUEST_BYTES_MAX as usize || end.is_none_or(|end| end > self.size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{len} bytes at {offset} do not fit the export's {} bytes", self.size),
            ));
        }
        Ok(len as u32)
    }

    pub fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let len = self.check(offset, buf.len())?;
        let handle = self.send(CMD_READ, offset, len, &[])?;
        self.reply(handle, "read", offset)?;
        self.stream.read_exact(buf)
    }

    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let len = self.check(offset, data.len())?;
        let handle = self.send(CMD_WRITE, offset, len, data)?;
        self.reply(handle, "write", offset)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        let handle = self.send(CMD_FLUSH, 0, 0, &[])?;
        self.reply(handle, "flush", 0)
    }

    /// Says goodbye (`NBD_CMD_DISC`); the server closes the connection.
    pub fn disconnect(mut self) -> io::Result<()> {
        self.send(CMD_DISC, 0, 0, &[]).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_name_host_port_and_export() {
        let u = NbdUri::parse("nbd://127.0.0.1/vol1").unwrap();
        assert_eq!(u.address, "127.0.0.1:10809");
        assert_eq!(u.export, "vol1");
        let u = NbdUri::parse("nbd://[::1]:7000/v").unwrap();
        assert_eq!(u.address, "[::1]:7000");
        let u = NbdUri::parse("nbd://[::1]/v").unwrap();
        assert_eq!(u.address, "[::1]:10809");
        assert!(NbdUri::parse("http://x/y").is_err());
        assert!(NbdUri::parse("nbd:///y").is_err());
    }
}
