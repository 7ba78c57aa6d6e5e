/* Wine 8.0 (Debian 12) lacks bcryptprimitives.dll, whose ProcessPrng Rust's std calls for
 * its random numbers (HashMap seeds) on Windows 10+. This stand-in, installed only into the
 * private Wine prefix of .ci/windows, forwards to BCryptGenRandom, which Wine does have.
 * Nothing of it ships: real Windows has the real DLL. */
#include <windows.h>
#include <bcrypt.h>

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG n = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (BCryptGenRandom(NULL, data, n, BCRYPT_USE_SYSTEM_PREFERRED_RNG) != 0)
            return FALSE;
        data += n;
        len -= n;
    }
    return TRUE;
}
