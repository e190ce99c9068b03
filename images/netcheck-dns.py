# A DNS server for images/netcheck.sh: every A query gets the address
# given as argv[1] (the test namespace's own), nothing else.
import socket, struct, sys
addr = sys.argv[1]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((addr, 53))
while True:
    q, peer = s.recvfrom(512)
    end = q.index(b"\0", 12) + 5
    qtype = struct.unpack(">H", q[end - 4:end - 2])[0]
    ans = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + socket.inet_aton(addr) if qtype == 1 else b""
    s.sendto(q[:2] + b"\x81\x80\x00\x01" + struct.pack(">H", 1 if ans else 0) + b"\x00\x00\x00\x00" + q[12:end] + ans, peer)
