pub mod http;
pub mod node;
pub mod posix_table;
