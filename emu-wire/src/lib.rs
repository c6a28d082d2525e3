//! RoCEv2 wire formats (land in a later commit).
#![forbid(unsafe_code)]
