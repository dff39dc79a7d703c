/* The SPDK headers the `spdk` backend uses (bindgen input). */
#include <spdk/stdinc.h>
#include <spdk/env.h>
#include <spdk/nvme.h>
#include <spdk/version.h>
