#!/usr/bin/env python3
# Independent XChaCha20-Poly1305 (HChaCha20 by hand + pyca ChaCha20Poly1305)
import struct, sys
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
def rotl(v,c): return ((v<<c)&0xffffffff)|(v>>(32-c))
def qr(s,a,b,c,d):
    s[a]=(s[a]+s[b])&0xffffffff; s[d]^=s[a]; s[d]=rotl(s[d],16)
    s[c]=(s[c]+s[d])&0xffffffff; s[b]^=s[c]; s[b]=rotl(s[b],12)
    s[a]=(s[a]+s[b])&0xffffffff; s[d]^=s[a]; s[d]=rotl(s[d],8)
    s[c]=(s[c]+s[d])&0xffffffff; s[b]^=s[c]; s[b]=rotl(s[b],7)
def hchacha20(key, nonce16):
    s=[0x61707865,0x3320646e,0x79622d32,0x6b206574]+list(struct.unpack('<8I',key))+list(struct.unpack('<4I',nonce16))
    for _ in range(10):
        qr(s,0,4,8,12);qr(s,1,5,9,13);qr(s,2,6,10,14);qr(s,3,7,11,15)
        qr(s,0,5,10,15);qr(s,1,6,11,12);qr(s,2,7,8,13);qr(s,3,4,9,14)
    return struct.pack('<8I',*(s[0:4]+s[12:16]))
def xseal(key, nonce24, pt, ad):
    sub=hchacha20(key, nonce24[:16])
    return ChaCha20Poly1305(sub).encrypt(b'\0'*4+nonce24[16:], pt, ad)
def item_ad(group, ident, cls, gen):
    g=group.encode(); i=ident.encode()
    return b'kcfs-item'+bytes([1,cls])+struct.pack('<Q',gen)+struct.pack('<H',len(g))+g+struct.pack('<H',len(i))+i
if __name__=='__main__':
    key=bytes(range(0x80,0xa0)); nonce=bytes(range(0x40,0x58))
    pt=b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it."
    ad=bytes.fromhex('50515253c0c1c2c3c4c5c6c7')
    print('draft', xseal(key,nonce,pt,ad).hex())
    ad2=item_ad('TEAMID.com.example.shared','db-password',3,42)
    print('itemad', ad2.hex())
    print('item', xseal(bytes(range(32)), bytes(range(100,124)), b'hunter2', ad2).hex())
