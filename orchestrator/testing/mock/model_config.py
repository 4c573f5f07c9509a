"""Triton's ``ModelConfig`` message (``model_config.proto``, package ``inference``) built at
import time from a schema declared here, so the mock parses ``config.pbtxt`` with protobuf's
own ``text_format`` (the C++ parser Triton's core uses has the same grammar) without
``tritonclient``.

Why protobuf and not a parser of our own: a configuration is protobuf text format (comments,
``[a, b]`` lists, ``key: value`` or ``key { }``, enums by name, maps as repeated entries), and
the dict a model gets in ``args["model_config"]`` is protobuf's JSON of the *whole* message
(every field printed with its default); both come right only from a parser that knows every
field's type. protobuf is a pure-Python-capable wheel for every platform; the schema below is
the message layout (names, numbers, types) only, checked field by field against
``tritonclient``'s compiled ``model_config_pb2`` where that is installed
(tests/mock/test_pb_helpers.py).

Schema syntax (one declaration a line, nesting by two-space indentation)::

    enum NAME VALUE=NUMBER ...
    message NAME [map]
      FIELD NUMBER TYPE [repeated] [oneof=NAME]

``TYPE`` is a scalar (``string``, ``int64`` ...) or a message/enum name relative to the
package (``ModelInstanceGroup.Kind``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Set

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "inference"
FILE_NAME = "orchestrator_mock_model_config.proto"

SCHEMA = """
enum DataType TYPE_INVALID=0 TYPE_BOOL=1 TYPE_UINT8=2 TYPE_UINT16=3 TYPE_UINT32=4 TYPE_UINT64=5 TYPE_INT8=6 TYPE_INT16=7 TYPE_INT32=8 TYPE_INT64=9 TYPE_FP16=10 TYPE_FP32=11 TYPE_FP64=12 TYPE_STRING=13 TYPE_BF16=14
message ModelRateLimiter
  message Resource
    name 1 string
    global 2 bool
    count 3 uint32
  resources 1 ModelRateLimiter.Resource repeated
  priority 2 uint32
message ModelInstanceGroup
  enum Kind KIND_AUTO=0 KIND_GPU=1 KIND_CPU=2 KIND_MODEL=3
  message SecondaryDevice
    enum SecondaryDeviceKind KIND_NVDLA=0
    kind 1 ModelInstanceGroup.SecondaryDevice.SecondaryDeviceKind
    device_id 2 int64
  name 1 string
  kind 4 ModelInstanceGroup.Kind
  count 2 int32
  rate_limiter 6 ModelRateLimiter
  gpus 3 int32 repeated
  secondary_devices 8 ModelInstanceGroup.SecondaryDevice repeated
  profile 5 string repeated
  passive 7 bool
  host_policy 9 string
message ModelTensorReshape
  shape 1 int64 repeated
message ModelInput
  enum Format FORMAT_NONE=0 FORMAT_NHWC=1 FORMAT_NCHW=2
  name 1 string
  data_type 2 DataType
  format 3 ModelInput.Format
  dims 4 int64 repeated
  reshape 5 ModelTensorReshape
  is_shape_tensor 6 bool
  allow_ragged_batch 7 bool
  optional 8 bool
  is_non_linear_format_io 9 bool
message ModelOutput
  name 1 string
  data_type 2 DataType
  dims 3 int64 repeated
  reshape 5 ModelTensorReshape
  label_filename 4 string
  is_shape_tensor 6 bool
  is_non_linear_format_io 7 bool
message BatchInput
  enum Kind BATCH_ELEMENT_COUNT=0 BATCH_ACCUMULATED_ELEMENT_COUNT=1 BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO=2 BATCH_MAX_ELEMENT_COUNT_AS_SHAPE=3 BATCH_ITEM_SHAPE=4 BATCH_ITEM_SHAPE_FLATTEN=5
  kind 1 BatchInput.Kind
  target_name 2 string repeated
  data_type 3 DataType
  source_input 4 string repeated
message BatchOutput
  enum Kind BATCH_SCATTER_WITH_INPUT_SHAPE=0
  target_name 1 string repeated
  kind 2 BatchOutput.Kind
  source_input 3 string repeated
message ModelVersionPolicy
  message Latest
    num_versions 1 uint32
  message All
  message Specific
    versions 1 int64 repeated
  latest 1 ModelVersionPolicy.Latest oneof=policy_choice
  all 2 ModelVersionPolicy.All oneof=policy_choice
  specific 3 ModelVersionPolicy.Specific oneof=policy_choice
message ModelOptimizationPolicy
  enum ModelPriority PRIORITY_DEFAULT=0 PRIORITY_MAX=1 PRIORITY_MIN=2
  message Graph
    level 1 int32
  message Cuda
    message GraphSpec
      message Shape
        dim 1 int64 repeated
      message LowerBound
        message InputEntry map
          key 1 string
          value 2 ModelOptimizationPolicy.Cuda.GraphSpec.Shape
        batch_size 1 int32
        input 2 ModelOptimizationPolicy.Cuda.GraphSpec.LowerBound.InputEntry repeated
      message InputEntry map
        key 1 string
        value 2 ModelOptimizationPolicy.Cuda.GraphSpec.Shape
      batch_size 1 int32
      input 2 ModelOptimizationPolicy.Cuda.GraphSpec.InputEntry repeated
      graph_lower_bound 3 ModelOptimizationPolicy.Cuda.GraphSpec.LowerBound
    graphs 1 bool
    busy_wait_events 2 bool
    graph_spec 3 ModelOptimizationPolicy.Cuda.GraphSpec repeated
    output_copy_stream 4 bool
  message ExecutionAccelerators
    message Accelerator
      message ParametersEntry map
        key 1 string
        value 2 string
      name 1 string
      parameters 2 ModelOptimizationPolicy.ExecutionAccelerators.Accelerator.ParametersEntry repeated
    gpu_execution_accelerator 1 ModelOptimizationPolicy.ExecutionAccelerators.Accelerator repeated
    cpu_execution_accelerator 2 ModelOptimizationPolicy.ExecutionAccelerators.Accelerator repeated
  message PinnedMemoryBuffer
    enable 1 bool
  graph 1 ModelOptimizationPolicy.Graph
  priority 2 ModelOptimizationPolicy.ModelPriority
  cuda 3 ModelOptimizationPolicy.Cuda
  execution_accelerators 4 ModelOptimizationPolicy.ExecutionAccelerators
  input_pinned_memory 5 ModelOptimizationPolicy.PinnedMemoryBuffer
  output_pinned_memory 6 ModelOptimizationPolicy.PinnedMemoryBuffer
  gather_kernel_buffer_threshold 7 uint32
  eager_batching 8 bool
message ModelQueuePolicy
  enum TimeoutAction REJECT=0 DELAY=1
  timeout_action 1 ModelQueuePolicy.TimeoutAction
  default_timeout_microseconds 2 uint64
  allow_timeout_override 3 bool
  max_queue_size 4 uint32
message ModelDynamicBatching
  message PriorityQueuePolicyEntry map
    key 1 uint64
    value 2 ModelQueuePolicy
  preferred_batch_size 1 int32 repeated
  max_queue_delay_microseconds 2 uint64
  preserve_ordering 3 bool
  priority_levels 4 uint64
  default_priority_level 5 uint64
  default_queue_policy 6 ModelQueuePolicy
  priority_queue_policy 7 ModelDynamicBatching.PriorityQueuePolicyEntry repeated
message ModelSequenceBatching
  message Control
    enum Kind CONTROL_SEQUENCE_START=0 CONTROL_SEQUENCE_READY=1 CONTROL_SEQUENCE_END=2 CONTROL_SEQUENCE_CORRID=3
    kind 1 ModelSequenceBatching.Control.Kind
    int32_false_true 2 int32 repeated
    fp32_false_true 3 float repeated
    bool_false_true 5 bool repeated
    data_type 4 DataType
  message ControlInput
    name 1 string
    control 2 ModelSequenceBatching.Control repeated
  message InitialState
    data_type 1 DataType
    dims 2 int64 repeated
    zero_data 3 bool oneof=state_data
    data_file 4 string oneof=state_data
    name 5 string
  message State
    input_name 1 string
    output_name 2 string
    data_type 3 DataType
    dims 4 int64 repeated
    initial_state 5 ModelSequenceBatching.InitialState repeated
    use_same_buffer_for_input_output 6 bool
    use_growable_memory 7 bool
  message StrategyDirect
    max_queue_delay_microseconds 1 uint64
    minimum_slot_utilization 2 float
  message StrategyOldest
    max_candidate_sequences 1 int32
    preferred_batch_size 2 int32 repeated
    max_queue_delay_microseconds 3 uint64
    preserve_ordering 4 bool
  direct 3 ModelSequenceBatching.StrategyDirect oneof=strategy_choice
  oldest 4 ModelSequenceBatching.StrategyOldest oneof=strategy_choice
  max_sequence_idle_microseconds 1 uint64
  control_input 2 ModelSequenceBatching.ControlInput repeated
  state 5 ModelSequenceBatching.State repeated
  iterative_sequence 6 bool
message ModelEnsembling
  message Step
    message InputMapEntry map
      key 1 string
      value 2 string
    message OutputMapEntry map
      key 1 string
      value 2 string
    model_name 1 string
    model_version 2 int64
    input_map 3 ModelEnsembling.Step.InputMapEntry repeated
    output_map 4 ModelEnsembling.Step.OutputMapEntry repeated
    model_namespace 5 string
  step 1 ModelEnsembling.Step repeated
  max_inflight_requests 2 uint32
message ModelParameter
  string_value 1 string
message ModelWarmup
  message Input
    data_type 1 DataType
    dims 2 int64 repeated
    zero_data 3 bool oneof=input_data_type
    random_data 4 bool oneof=input_data_type
    input_data_file 5 string oneof=input_data_type
  message InputsEntry map
    key 1 string
    value 2 ModelWarmup.Input
  name 1 string
  batch_size 2 uint32
  inputs 3 ModelWarmup.InputsEntry repeated
  count 4 uint32
message ModelOperations
  op_library_filename 1 string repeated
message ModelTransactionPolicy
  decoupled 1 bool
message ModelRepositoryAgents
  message Agent
    message ParametersEntry map
      key 1 string
      value 2 string
    name 1 string
    parameters 2 ModelRepositoryAgents.Agent.ParametersEntry repeated
  agents 1 ModelRepositoryAgents.Agent repeated
message ModelResponseCache
  enable 1 bool
message ModelMetrics
  message MetricControl
    message MetricIdentifier
      family 1 string
    message HistogramOptions
      buckets 1 double repeated
    metric_identifier 1 ModelMetrics.MetricControl.MetricIdentifier
    histogram_options 2 ModelMetrics.MetricControl.HistogramOptions oneof=metric_options
  metric_control 1 ModelMetrics.MetricControl repeated
message ModelConfig
  message CcModelFilenamesEntry map
    key 1 string
    value 2 string
  message MetricTagsEntry map
    key 1 string
    value 2 string
  message ParametersEntry map
    key 1 string
    value 2 ModelParameter
  name 1 string
  platform 2 string
  backend 17 string
  runtime 25 string
  version_policy 3 ModelVersionPolicy
  max_batch_size 4 int32
  input 5 ModelInput repeated
  output 6 ModelOutput repeated
  batch_input 20 BatchInput repeated
  batch_output 21 BatchOutput repeated
  optimization 12 ModelOptimizationPolicy
  dynamic_batching 11 ModelDynamicBatching oneof=scheduling_choice
  sequence_batching 13 ModelSequenceBatching oneof=scheduling_choice
  ensemble_scheduling 15 ModelEnsembling oneof=scheduling_choice
  instance_group 7 ModelInstanceGroup repeated
  default_model_filename 8 string
  cc_model_filenames 9 ModelConfig.CcModelFilenamesEntry repeated
  metric_tags 10 ModelConfig.MetricTagsEntry repeated
  parameters 14 ModelConfig.ParametersEntry repeated
  model_warmup 16 ModelWarmup repeated
  model_operations 18 ModelOperations
  model_transaction_policy 19 ModelTransactionPolicy
  model_repository_agents 23 ModelRepositoryAgents
  response_cache 24 ModelResponseCache
  model_metrics 26 ModelMetrics
"""

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    name[len("TYPE_"):].lower(): number
    for name, number in _F.Type.items()
    if name not in ("TYPE_MESSAGE", "TYPE_ENUM", "TYPE_GROUP")
}


def _depth(line: str) -> int:
    return (len(line) - len(line.lstrip())) // 2


def _enum_names(lines: List[str]) -> Set[str]:
    """The package-relative names of the enums declared (``ModelInput.Format``)."""
    enums: Set[str] = set()
    path: List[str] = []
    for line in lines:
        words = line.split()
        del path[_depth(line):]
        if words[0] == "enum":
            enums.add(".".join(path + [words[1]]))
        elif words[0] == "message":
            path.append(words[1])
    return enums


def _add_field(parent: Any, words: List[str], enums: Set[str], oneofs: Dict[str, int]) -> None:
    name, number, type_name = words[0], int(words[1]), words[2]
    field = parent.field.add(name=name, number=number)
    field.label = _F.LABEL_REPEATED if "repeated" in words[3:] else _F.LABEL_OPTIONAL
    if type_name in _SCALARS:
        field.type = _SCALARS[type_name]
    else:
        field.type = _F.TYPE_ENUM if type_name in enums else _F.TYPE_MESSAGE
        field.type_name = f".{PACKAGE}.{type_name}"
    for word in words[3:]:
        if word.startswith("oneof="):
            group = word[len("oneof="):]
            if group not in oneofs:
                oneofs[group] = len(parent.oneof_decl)
                parent.oneof_decl.add(name=group)
            field.oneof_index = oneofs[group]


def _parse(schema: str) -> descriptor_pb2.FileDescriptorProto:
    """The file descriptor that :data:`SCHEMA` declares."""
    proto = descriptor_pb2.FileDescriptorProto(name=FILE_NAME, package=PACKAGE, syntax="proto3")
    lines = [line for line in schema.splitlines() if line.strip()]
    enums = _enum_names(lines)
    stack: List[Any] = [proto]
    oneofs: List[Dict[str, int]] = [{}]
    for line in lines:
        words = line.split()
        del stack[_depth(line) + 1:]
        del oneofs[_depth(line) + 1:]
        parent = stack[-1]
        if words[0] == "enum":
            enum = parent.enum_type.add(name=words[1])
            for item in words[2:]:
                value_name, number = item.split("=")
                enum.value.add(name=value_name, number=int(number))
        elif words[0] == "message":
            message = parent.message_type.add() if parent is proto else parent.nested_type.add()
            message.name = words[1]
            if "map" in words[2:]:
                message.options.map_entry = True
            stack.append(message)
            oneofs.append({})
        else:
            _add_field(parent, words, enums, oneofs[-1])
    return proto


FILE_PROTO = _parse(SCHEMA)
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(FILE_PROTO)

#: The ``inference.ModelConfig`` message class (a private descriptor pool, so it never
#: clashes with ``tritonclient``'s ``model_config_pb2`` in the same process).
ModelConfig: Any = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.ModelConfig"))
