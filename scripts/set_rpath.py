#!/usr/bin/env python3
"""set_rpath.py NEW FILE...: sets the DT_RPATH (or DT_RUNPATH) of 64-bit little-endian ELF files
to NEW, in place, without patchelf (not installed on the build machines).

CMake's build RPATH lists every folder a library was linked from (/usr/local/cuda/lib64, the
build machine's OpenBLAS folder...). DT_RPATH outranks LD_LIBRARY_PATH, so on the GPU machine
those folders, where they exist, would decide which CUDA libraries load. scripts/bundle_gpu.sh
sets the bundle's copies to $ORIGIN/../lib alone, so the bundled libraries are found and
LD_LIBRARY_PATH decides the rest.

The new string is written over the old one in .dynstr, padded with NULs, so it must not be
longer; a file whose RPATH string is shared with another entry (the linker can merge a string
that is the suffix of another) is refused rather than corrupted. Exit status 1 on any refusal.
"""
import struct
import sys

DT_NULL, DT_STRTAB, DT_STRSZ, DT_RPATH, DT_RUNPATH = 0, 5, 10, 15, 29


def set_rpath(path, new):
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ValueError("not a 64-bit little-endian ELF file")
        (phoff,) = struct.unpack_from("<Q", data, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        loads, dynamic = [], None
        for i in range(phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(
                "<IIQQQQQQ", data, phoff + i * phentsize)
            if p_type == 1:  # PT_LOAD: maps file offsets to addresses
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == 2:  # PT_DYNAMIC
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            raise ValueError("no dynamic section (a static executable)")

        def offset_of(vaddr):
            for va, off, size in loads:
                if va <= vaddr < va + size:
                    return off + vaddr - va
            raise ValueError(f"address {vaddr:#x} is in no loaded segment")

        entries = []
        for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == DT_NULL:
                break
            entries.append((tag, val))
        tags = dict(entries)
        strtab = offset_of(tags[DT_STRTAB])
        paths = [(t, v) for t, v in entries if t in (DT_RPATH, DT_RUNPATH)]
        if not paths:
            raise ValueError("no RPATH or RUNPATH to set")
        for tag, val in paths:
            start = strtab + val
            end = data.index(b"\0", start)
            old = bytes(data[start:end])
            # Another entry pointing into this string (suffix merging) would change with it.
            if any(t in (1, 14, DT_RPATH, DT_RUNPATH) and v != val and val < v <= val + len(old)
                   for t, v in entries):  # 1: DT_NEEDED, 14: DT_SONAME
                raise ValueError("its RPATH string is shared with another entry")
            enc = new.encode()
            if len(enc) > len(old):
                raise ValueError(f"new RPATH is longer than the old one ({old.decode()})")
            data[start:end] = enc + b"\0" * (len(old) - len(enc))
        f.seek(0)
        f.write(data)


def main():
    if len(sys.argv) < 3:
        print("usage: set_rpath.py NEW FILE...", file=sys.stderr)
        return 64
    status = 0
    for path in sys.argv[2:]:
        try:
            set_rpath(path, sys.argv[1])
        except (ValueError, KeyError, OSError) as e:
            print(f"set_rpath.py: {path}: {e}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
