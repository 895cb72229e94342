#ifndef CFUSE_SHIM_H
#define CFUSE_SHIM_H
#define FUSE_USE_VERSION 35
#include <fuse3/fuse_lowlevel.h>
#endif
