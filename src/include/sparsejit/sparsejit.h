// Everything public in one include.
#pragma once

#include "sparsejit/attention.h"
#include "sparsejit/attention_spec.h"
#include "sparsejit/device.h"
#include "sparsejit/dtype.h"
#include "sparsejit/e23.h"
#include "sparsejit/e23_reference.h"
#include "sparsejit/e23_spec.h"
#include "sparsejit/error.h"
#include "sparsejit/jit.h"
#include "sparsejit/pattern.h"
#include "sparsejit/pattern_picture.h"
#include "sparsejit/reference.h"
#include "sparsejit/rownorm.h"
#include "sparsejit/rownorm_spec.h"
#include "sparsejit/cache.h"
#include "sparsejit/tune.h"
