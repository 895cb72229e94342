#!/usr/bin/python3
# A TPM that is busy for some commands: tpm2-tss's `cmd` TCTI runs this
# program and writes each TPM command to its standard input, expecting the
# response on its standard output. Commands are passed to the software TPM
# at 127.0.0.1:PORT (its raw command channel), except those whose command
# code is among BUSY, which get TPM_RC_RETRY (TPM 2.0 Part 2, 6.6.3: "the
# TPM was not able to start the command") without reaching the TPM.
# Usage: busy-tpm-proxy.py PORT BUSY_CODE[,BUSY_CODE...] (hex, e.g. 15e for Unseal)
import socket
import struct
import sys

port = int(sys.argv[1])
busy = {int(code, 16) for code in sys.argv[2].split(",")}
tpm = socket.create_connection(("127.0.0.1", port))
RETRY = 0x922


def read_exactly(stream, count):
    data = b""
    while len(data) < count:
        chunk = stream.read(count - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data


def receive_response():
    header = b""
    while len(header) < 10:
        chunk = tpm.recv(10 - len(header))
        if not chunk:
            sys.exit(1)
        header += chunk
    size = struct.unpack(">I", header[2:6])[0]
    body = b""
    while len(body) < size - 10:
        chunk = tpm.recv(size - 10 - len(body))
        if not chunk:
            sys.exit(1)
        body += chunk
    return header + body


stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
while True:
    header = read_exactly(stdin, 10)
    tag, size, code = struct.unpack(">HII", header)
    command = header + read_exactly(stdin, size - 10)
    if code in busy:
        stdout.write(struct.pack(">HII", 0x8001, 10, RETRY))
    else:
        tpm.sendall(command)
        stdout.write(receive_response())
    stdout.flush()
