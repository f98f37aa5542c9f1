// The whole public library API in one include: tensors, autograd, AMP, layers, models, optimizers, data and I/O.
#pragma once

#include "castor/version.h"

// Tensors and ops.
#include "castor/allocator.h"
#include "castor/backends.h"
#include "castor/check.h"
#include "castor/convert.h"
#include "castor/device.h"
#include "castor/dtype.h"
#include "castor/half.h"
#include "castor/log.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "castor/tensor.h"

// Autograd and automatic mixed precision.
#include "castor/amp.h"
#include "castor/autocast.h"
#include "castor/autograd.h"
#include "castor/ddp.h"
#include "castor/dist.h"
#include "castor/explain.h"
#include "castor/opt_level.h"
#include "castor/grad_scaler.h"
#include "castor/op_kind.h"

// Layers, models, optimizers.
#include "castor/functional.h"
#include "castor/lr_scheduler.h"
#include "castor/models.h"
#include "castor/nn.h"
#include "castor/optim.h"

// Data and files.
#include "castor/checkpoint.h"
#include "castor/corpus.h"
#include "castor/data.h"
#include "castor/datasets.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "castor/llmc.h"
#include "castor/lm_batch.h"
#include "castor/safetensors.h"
#include "castor/serialize.h"
#include "castor/state_dict.h"
#include "castor/token_file.h"
#include "castor/tokenizer.h"
